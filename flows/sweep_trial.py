"""The `sweep-trial` flow: one trial of a sweep, submitted by the `sweep` flow as a run of the `sweep-trial`
deployment on the GPU pool. It trains the trial as an ordinary tracked job (a child run of the sweep's MLflow parent
run), reports each epoch's validation metric to the study and stops the job when the study's pruner says so, then
tells the study the result. Everything else it needs is in the study (ntp.run.sweep.remote)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.sweep import train_trial


@flow(name="sweep-trial", flow_run_name="{study_name}-trial-{number}")
def sweep_trial(study_name: str, number: int, storage: str | None = None) -> dict[str, Any]:
    """Train trial ``number`` of the study ``study_name`` in the Optuna database ``storage`` (default: beside
    MLflow's). Fails when its training job fails; a pruned trial completes (its state says PRUNED)."""
    return train_trial(study_name, number, storage)
