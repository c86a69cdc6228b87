"""Evaluate a trained model on a store's splits and log the metrics to MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ntp.run import tracking


@task(name="fetch-model", cache_policy=NO_CACHE)
def fetch_model(run_id: str, dst: str) -> tuple[str, dict[str, Any]]:
    """``ntp.run.tracking.download_model``: the model file of an MLflow run and its description."""
    path, info = tracking.download_model(run_id, dst)
    return str(path), info


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_model(
    model_path: str, store: str, run_id: str | None = None, experiment: str | None = None
) -> dict[str, Any]:
    """``ntp.engine.infer.inference.evaluate_model``, then the metrics go to ``run_id`` (or a new evaluate run)."""
    from ntp.engine.infer.inference import evaluate_model as evaluate

    logger = get_run_logger()
    metrics = evaluate(Path(model_path), store)  # a folder or a URL (storage.location)
    run_id = tracking.log_evaluation(run_id, metrics, model_path=model_path, store=store, experiment=experiment)
    logger.info(
        "evaluation (%s): %s; MLflow run %s",
        metrics.get("metric"),
        {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)},
        run_id,
    )
    return {**metrics, "run_id": run_id}
