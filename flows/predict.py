"""The `predict` flow: a model (file or MLflow URI) applied to a store -> a Parquet export of predictions, node
embeddings or link scores; schedulable (prefect.yaml), so a nightly run can publish fresh embeddings."""

from __future__ import annotations

import tempfile
from typing import Any, Literal

from prefect import flow

from flows.params import LaunchOptions
from flows.train import _retry
from ntp.engine.infer.predict import Request
from ntp.run.inference_job import inference_spec
from tasks.predict import fetch_model
from tasks.predict import predict as run_predict


@flow(name="predict")
def predict(
    store: str,
    model_uri: str,
    out: str,
    export: Literal["predictions", "embeddings", "scores"] = "predictions",
    layer: int | None = None,
    pairs: str | None = None,
    launch: LaunchOptions = LaunchOptions(nproc=1),
    any_store: bool = False,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Apply ``model_uri`` (a model file, ``runs:/RUN_ID``, ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS``) to
    ``store`` and write ``out`` (a Parquet dataset, replaced when the job succeeds unless ``overwrite`` is off).
    ``layer``: embeddings' layer (default: the last hidden one); ``pairs``: a link model's node pairs file."""
    with tempfile.TemporaryDirectory(prefix="ntp-predict-") as tmp:
        model = fetch_model(model_uri, tmp)
        # resolved in the flow: a model that does not fit the store fails before the job starts
        spec = inference_spec(
            model,
            store,
            any_store=any_store,
            nproc=launch.nproc,
            launch=launch.model_dump(exclude={"nproc", "retries", "retry_delay_s"}),
        )
        request = Request(model=model, export=export, out=out, layer=layer, pairs=pairs)
        task = run_predict.with_options(
            retries=launch.retries, retry_delay_seconds=launch.retry_delay_s, retry_condition_fn=_retry
        )  # never a retry of bad input
        done = task(spec, request, overwrite, source=model_uri)
    return {**done, "model_uri": model_uri, "export": export}
