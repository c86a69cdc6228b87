"""Hyperparameter sweeps: an Optuna study whose trials are ordinary tracked training jobs (``ntp train``), pruned
from their live validation metric, under one MLflow parent run. Nothing here imports Prefect (flows/sweep.py runs
the same trials as flow runs on a work pool)."""
