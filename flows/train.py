"""The `train` flow: one tracked training job on an existing store."""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.params import LaunchOptions, TrainingOptions, train_config
from ntp.config import ConfigError
from tasks.train import train_model


def _retry(task: Any, task_run: Any, state: Any) -> bool:
    """Retry failed training jobs, but not invalid configurations."""
    try:
        state.result()
    except ConfigError:
        return False
    except BaseException:
        return True
    return True


def run_training(store: str, training: Any, launch: LaunchOptions, experiment: str | None) -> Any:
    """Run the train task with the launch options' retries (shared by `train` and `pipeline`).

    An explicit ``mode=single`` runs one process unless ``nproc`` was given too.
    """
    nproc = launch.resolved_nproc() if launch.nproc or training.mode != "single" else 1
    cfg = train_config(training, store=store, nproc=nproc)
    task = train_model.with_options(retries=launch.retries, retry_delay_seconds=launch.retry_delay_s,
                                    retry_condition_fn=_retry)
    return task(cfg, nproc=nproc, nnodes=launch.nnodes, node_rank=launch.node_rank,
                rdzv_endpoint=launch.rdzv_endpoint, timeout_s=launch.timeout_s, experiment=experiment)


@flow(name="train")
def train(
    store: str,
    training: TrainingOptions = TrainingOptions(),  # type: ignore[valid-type]
    launch: LaunchOptions = LaunchOptions(),
    experiment: str | None = None,
) -> dict[str, Any]:
    """Train on ``store`` (a path from `prepare_dataset`); returns the MLflow run id and the summary."""
    result = run_training(store, training, launch, experiment)
    return {"run_id": result.run_id, "model_path": str(result.model_path) if result.model_path else None,
            "summary": result.summary}
