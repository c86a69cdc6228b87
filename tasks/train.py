"""Launch a training job inside an MLflow parent run."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from ntp.run.tracking import TrackedTraining, train_tracked
from ntp.spec import LaunchSpec


@task(name="train", cache_policy=NO_CACHE)
def train_model(spec: LaunchSpec, *, experiment: str | None = None, register: str | None = None) -> TrackedTraining:
    """``ntp.run.tracking.train_tracked``: torchrun job whose worker output streams into this run's logs, with the
    MLflow run's curves updated as the epochs end.

    Fails with the failing rank's traceback (``WorkerFailed``); the MLflow run is then FAILED.
    Retries are set by the caller with ``train_model.with_options(retries=...)``.
    """
    logger = get_run_logger()
    # the MLflow run is named model-arch-mode-ranks-date like `ntp train`'s; the flow run is linked by its id tag
    result = train_tracked(
        spec, experiment=experiment, flow_run_id=flow_run.get_id(), on_line=logger.info, register=register
    )
    logger.info("training done in %.1f s; MLflow run %s", result.wall_s, result.run_id)
    return result
