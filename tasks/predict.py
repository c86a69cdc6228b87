"""Apply a model to a store on the training launcher and publish the export (ntp.run.inference_job)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ntp.run.inference_job import run_inference
from ntp.run.tracking.mlflow_model import fetch_model_file
from ntp.spec import LaunchSpec


@task(name="fetch-model-file", cache_policy=NO_CACHE)
def fetch_model(model_uri: str, dst: str) -> str:
    """``ntp.run.tracking.mlflow_model.fetch_model_file``: a file path, runs:/ or models:/ URI -> a local file."""
    return str(fetch_model_file(model_uri, dst))


@task(name="predict", cache_policy=NO_CACHE)
def predict(spec: LaunchSpec, request: Any, overwrite: bool = True, source: str | None = None) -> dict[str, Any]:
    """``ntp.run.inference_job.run_inference``: the ranks' output streams into this task's log."""
    logger = get_run_logger()
    done = run_inference(spec, request, overwrite=overwrite, on_line=logger.info, source=source)
    logger.info(
        "%s of %s written to %s by %d rank(s) in %.1f s",
        request.export,
        spec.config.store,
        done["out"],
        done["world_size"],
        done["wall_s"],
    )
    return done
