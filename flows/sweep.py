"""The `sweep` flow: an Optuna study of tracked training jobs (one task run per trial, ``parallel`` at once), the
leaderboard and plots in one MLflow parent run and a Prefect artifact, the best model registered (challenger;
champion if it wins, which triggers the predict deployment). Re-running it with the same study name resumes it."""

from __future__ import annotations

import threading
from typing import Any, Literal

from prefect import flow, get_run_logger, unmapped

from flows.params import LaunchOptions
from ntp.run.sweep.space import load_space, parse_space
from ntp.run.sweep.study import SweepSettings, start_sweep
from ntp.run.sweep.sweep import finish_sweep
from tasks.promote import announce_champion
from tasks.publish import artifact_key
from tasks.sweep import publish_sweep, run_sweep_trial


def _launch_args(launch: LaunchOptions) -> list[str]:
    argv = ["--device", launch.device]
    if launch.nproc:
        argv += ["--nproc", str(launch.nproc)]
    if launch.job_timeout_s:
        argv += ["--job-timeout", str(launch.job_timeout_s)]
    return argv


@flow(name="sweep")
def sweep(
    store: str,
    space: dict[str, Any] | str,
    study_name: str,
    trials: int = 20,
    parallel: int = 1,
    sampler: Literal["tpe", "random", "grid"] = "tpe",
    pruner: Literal["median", "hyperband", "none"] = "median",
    seed: int | None = None,
    experiment: str | None = None,
    registered_model: str | None = None,
    champion_margin: float = 0.0,
    launch: LaunchOptions = LaunchOptions(nproc=1),
) -> dict[str, Any]:
    """Search ``space`` (a YAML file's path, or its content: ``{"space": {...}, "fixed": {...}}``) on ``store``
    with ``trials`` trials, ``parallel`` training jobs at once; the study named ``study_name`` resumes."""
    settings = SweepSettings(
        space=load_space(space) if isinstance(space, str) else parse_space(space, source="the space parameter"),
        store=store,
        study_name=study_name,
        n_trials=trials,
        parallel=parallel,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        experiment=experiment,
        register=registered_model,
        launch_args=_launch_args(launch),
        device=launch.device,
    )
    started = start_sweep(settings, on_line=get_run_logger().info)
    try:
        slots = threading.BoundedSemaphore(parallel)
        futures = run_sweep_trial.map(unmapped(started), unmapped(slots), range(started.remaining))
        futures.result()
    except BaseException as exc:
        started.fail(exc)
        raise
    result = finish_sweep(started, margin=champion_margin)
    publish_sweep(result, artifact_key(f"sweep-{study_name}"))
    decision = (result.registered or {}).get("decision")
    if decision and decision["promoted"]:
        announce_champion(decision, store)
    return {
        "parent_run_id": result.parent_run_id,
        "best_trial": result.best_trial,
        "best_value": result.best_value,
        "best_params": result.best_params,
        "counts": result.counts,
        "registered": result.registered,
    }
