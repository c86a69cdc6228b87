"""The `train` flow: one tracked training job on an existing store."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.params import LaunchOptions, TrainingOptions, launch_spec
from ntp.errors import is_input_error
from tasks.train import train_model


def _retry(task: Any, task_run: Any, state: Any) -> bool:
    """Retry failed training jobs (a lost worker may come back), never invalid input (it would fail again)."""
    try:
        state.result()
    except BaseException as exc:
        return not is_input_error(exc)
    return True


def run_training(
    store: str, training: Any, launch: LaunchOptions, experiment: str | None, register: str | None = None
) -> Any:
    """Run the train task with the launch options' retries (shared by `train` and `pipeline`). The launch spec is
    resolved here, in the flow, so an invalid combination fails before any task runs."""
    spec = launch_spec(training, launch, store=store)
    task = train_model.with_options(
        retries=launch.retries, retry_delay_seconds=launch.retry_delay_s, retry_condition_fn=_retry
    )
    return task(spec, experiment=experiment, register=register)


@flow(name="train")
def train(
    store: str,
    training: TrainingOptions = TrainingOptions(),  # type: ignore[valid-type]
    launch: LaunchOptions = LaunchOptions(),
    experiment: str | None = None,
) -> dict[str, Any]:
    """Train on ``store`` (a path from `prepare_dataset`); returns the MLflow run id and the summary."""
    result = run_training(store, training, launch, experiment)
    return {
        "run_id": result.run_id,
        "model_path": str(result.model_path) if result.model_path else None,
        "summary": result.summary,
    }
