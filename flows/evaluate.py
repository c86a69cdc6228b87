"""The `evaluate` flow: evaluate a trained model on a store's splits and log the metrics."""

from __future__ import annotations

import tempfile
from typing import Any

from prefect import flow

from ntp.run.tracking import run_store
from tasks.evaluate import evaluate_model, fetch_model


@flow(name="evaluate")
def evaluate(
    run_id: str | None = None, model_path: str | None = None, store: str | None = None, experiment: str | None = None
) -> dict[str, Any]:
    """Model from an MLflow training run (``run_id``) or a model/checkpoint file (``model_path`` + ``store``).

    With a run id the metrics go into that run; otherwise into a new evaluate run.
    """
    if run_id is None and model_path is None:
        raise ValueError("evaluate needs run_id (an MLflow training run) or model_path (a model file) and store")
    if run_id is not None and model_path is None:
        with tempfile.TemporaryDirectory(prefix="ntp-eval-") as tmp:
            path, _info = fetch_model(run_id, tmp)
            return evaluate_model(path, store or run_store(run_id), run_id, experiment)
    if store is None:
        if run_id is None:
            raise ValueError("evaluate with model_path needs store (the store the model was trained on)")
        store = run_store(run_id)
    return evaluate_model(model_path, store, run_id, experiment)
