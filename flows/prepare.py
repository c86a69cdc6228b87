"""The `prepare_dataset` flow: ingest a graph and build its store."""

from __future__ import annotations

from prefect import flow

from flows.params import DatasetOptions
from tasks.prepare import prepare_store


@flow(name="prepare_dataset", log_prints=True)
def prepare_dataset(dataset: DatasetOptions) -> str:
    """Build (or reuse) the store; returns its path."""
    return prepare_store(dataset.name, dataset.prepare_kwargs())
