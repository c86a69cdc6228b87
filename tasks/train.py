"""Launch a training job inside an MLflow parent run."""
from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from ntp.config import TrainConfig
from ntp.tracking import TrackedTraining, train_tracked


@task(name="train", cache_policy=NO_CACHE)
def train_model(
    cfg: TrainConfig,
    *,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    timeout_s: float | None = None,
    experiment: str | None = None,
) -> TrackedTraining:
    """``ntp.tracking.train_tracked``: torchrun job whose worker output streams into this run's logs.

    Fails with the failing rank's traceback (``TrainingFailed``); the MLflow run is then FAILED.
    Retries are set by the caller with ``train_model.with_options(retries=...)``.
    """
    logger = get_run_logger()
    result = train_tracked(cfg, nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                           timeout_s=timeout_s, experiment=experiment, flow_run_id=flow_run.get_id(),
                           run_name=flow_run.get_name(), on_line=logger.info)
    logger.info("training done in %.1f s; MLflow run %s", result.wall_s, result.run_id)
    return result
