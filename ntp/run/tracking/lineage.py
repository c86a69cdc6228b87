"""Lineage: a graph store as an MLflow dataset input of the runs that train or evaluate on it (its location as the
source, its fingerprint as the digest, its arrays as the schema), so a run, a logged model and a model version all
say which data made them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def store_schema(meta: Mapping[str, Any]) -> Any:
    """The store's node arrays as an MLflow tensor schema: features (float, nodes x feature_dim) and labels."""
    import numpy as np
    from mlflow.types.schema import Schema, TensorSpec

    specs = []
    if meta.get("feature_dim"):
        dtype = {"float16": np.float16}.get(str(meta.get("feature_dtype")), np.float32)  # bfloat16 reads as float32
        specs.append(TensorSpec(np.dtype(dtype), (-1, int(meta["feature_dim"])), "features"))
    if meta.get("num_classes") or meta.get("task_type") in ("multiclass", "binary", "multilabel"):
        specs.append(TensorSpec(np.dtype(np.int64), (-1,), "labels"))
    return Schema(specs) if specs else None


def log_store_input(client: Any, run_id: str, store_path: str | Path, meta: Mapping[str, Any], context: str) -> None:
    """Log the store as a dataset input of ``run_id`` (``mlflow.data.context``: train or evaluation)."""
    import mlflow.data  # noqa: F401 (registers the artifact dataset sources)
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.entities import DatasetInput, InputTag

    from storage.location import is_url

    if is_url(store_path):  # s3://...: MLflow's artifact source for that scheme
        from mlflow.data.dataset_source_registry import resolve_dataset_source

        source = resolve_dataset_source(str(store_path))
    else:
        source = LocalArtifactDatasetSource(str(Path(store_path).resolve()))
    digest = str(meta.get("fingerprint") or "")[:36] or None
    name = meta.get("name") or str(store_path).rstrip("/").rsplit("/", 1)[-1]
    dataset = MetaDataset(source=source, name=str(name), digest=digest, schema=store_schema(meta))
    client.log_inputs(
        run_id, [DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])]
    )
