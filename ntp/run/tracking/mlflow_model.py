"""The trained model as an MLflow model (pyfunc flavour, ``served_model.NodePredictor``: node ids in, predictions
out), logged into a run with its config, store fingerprint, input schema and metrics, and optionally registered in
the model registry under a name (a new version per call, as ``mlflow.register_model``)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ntp.run.tracking.mlflow_store import tracking_uri

#: The logged model's name in its run (the run's ``model/`` folder keeps the raw model file).
NAME = "ntp-model"
#: What the served model imports: the project's packages travel with it (they are not on a package index).
CODE_PATHS = [Path(__file__).resolve().parents[2], Path(__file__).resolve().parents[3] / "storage"]
REQUIREMENTS = ("torch", "numpy", "pandas", "pyarrow", "zarr", "pyyaml", "fsspec")


def log_mlflow_model(
    run_id: str,
    model_path: str | Path,
    *,
    store: str | Path,
    store_meta: Mapping[str, Any],
    config: Mapping[str, Any],
    metrics: Mapping[str, float | None],
    register: str | None = None,
    uri: str | None = None,
) -> dict[str, Any]:
    """Log the model file as an MLflow model in ``run_id`` (the run is reopened and ends FINISHED); with
    ``register``, a new version of that registered model. Returns {"model_uri", "model_id", "version"}."""
    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    mlflow.set_tracking_uri(uri or tracking_uri())
    meta = dict(store_meta)
    metadata = {
        "store_fingerprint": meta.get("fingerprint"),
        "store_name": meta.get("name"),
        "task_type": meta.get("task_type"),
        "metric": meta.get("metric"),
        "feature_dim": meta.get("feature_dim"),
        "num_nodes": meta.get("num_nodes"),
        "config": dict(config),
        "metrics": dict(metrics),
    }
    with mlflow.start_run(run_id=run_id), warnings.catch_warnings(), _no_copy_bar():
        # MLflow checks an input example by predicting it, a forward pass over the whole graph; the signature says
        # what the model takes, so its advice to give one is left unsaid
        warnings.filterwarnings("ignore", message=".*An input example was not provided")
        info = mlflow.pyfunc.log_model(
            name=NAME,
            python_model=str(Path(__file__).with_name("served_model.py")),
            artifacts={"model": str(model_path)},
            code_paths=[str(p) for p in CODE_PATHS],
            model_config={"store": str(store), "any_store": False},
            signature=ModelSignature(inputs=Schema([ColSpec("long", "node_id")])),
            pip_requirements=list(REQUIREMENTS),
            metadata=metadata,
            registered_model_name=register,
            params={k: str(v) for k, v in config.items()},
        )
        values = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if values:
            mlflow.log_metrics(values, model_id=info.model_id)
    if register and info.registered_model_version is not None and meta.get("fingerprint"):  # lineage
        mlflow.MlflowClient().set_model_version_tag(
            register, str(info.registered_model_version), "ntp.store_fingerprint", str(meta["fingerprint"])
        )
    return {"model_uri": info.model_uri, "model_id": info.model_id, "version": info.registered_model_version}


@contextmanager
def _no_copy_bar() -> Iterator[None]:
    """No progress bar while MLflow copies the model file into the logged model (a bar a run for one local copy),
    unless the user set MLflow's own switch for it."""
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as BAR

    if BAR.name in os.environ:
        yield
        return
    os.environ[BAR.name] = "false"
    try:
        yield
    finally:
        os.environ.pop(BAR.name, None)


def fetch_model_file(model_uri: str, dst: str | Path, uri: str | None = None) -> Path:
    """The model file behind ``model_uri``: a local file; ``runs:/<run id>`` (the training run's model file);
    or an MLflow model URI (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, a logged model's ``models:/m-...``)
    whose ``model`` artifact is downloaded into ``dst``."""
    if Path(model_uri).is_file():
        return Path(model_uri)
    if model_uri.startswith("runs:/"):
        from ntp.run.tracking.runs import download_model

        return download_model(model_uri.removeprefix("runs:/").split("/")[0], dst, uri=uri)[0]
    if not model_uri.startswith("models:/"):
        raise ValueError(
            f"model {model_uri!r} is neither a file nor an MLflow URI (runs:/RUN_ID, models:/NAME/VERSION,"
            " models:/NAME@ALIAS)"
        )
    import mlflow
    from mlflow.models import Model

    mlflow.set_tracking_uri(uri or tracking_uri())
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
    return local / Model.load(local).flavors["python_function"]["artifacts"]["model"]["path"]
