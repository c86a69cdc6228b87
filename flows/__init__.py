"""Prefect flows. Import the submodules (flows.pipeline, ...) explicitly: this package imports no Prefect."""
