"""A sweep's trials as Prefect task runs (one per trial, mapped), and its leaderboard as a Prefect artifact."""

from __future__ import annotations

import threading
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from ntp.run.sweep.report import SweepResult
from ntp.run.sweep.study import Sweep
from ntp.run.tracking import run_url


@task(name="trial", cache_policy=NO_CACHE, task_run_name="trial-{index}")
def run_sweep_trial(sweep: Sweep, slots: threading.BoundedSemaphore, index: int) -> dict[str, Any]:
    """One trial (Optuna ask-and-tell around one tracked `ntp train` job), at most ``parallel`` at once."""
    with slots:
        trial = sweep.run_one()
    if trial is None:  # the sampler ended the study (a grid fully run)
        return {"number": None, "state": "SKIPPED", "value": None, "params": {}}
    get_run_logger().info("trial %d %s value %s params %s", trial.number, trial.state.name, trial.value, trial.params)
    return {"number": trial.number, "state": trial.state.name, "value": trial.value, "params": trial.params}


def _cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("" if value is None else str(value))


def publish_sweep(result: SweepResult, key: str) -> str:
    """The leaderboard as a table artifact and a markdown summary (best trial, the registry decision, the parent
    run's link, where its plots are); returns the markdown artifact's id."""
    table = result.leaderboard.astype(object).where(result.leaderboard.notna(), None)
    create_table_artifact(
        table=table.to_dict(orient="records"), key=f"{key}-leaderboard", description="Trials, best first"
    )
    lines = [f"# Sweep {result.study_name}", ""]
    lines.append("trials: " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(result.counts.items())))
    if result.best_trial is not None:
        lines.append(f"\nbest: trial {result.best_trial}, valid {_cell(result.best_value)}, `{result.best_params}`")
    if result.registered:
        d = result.registered["decision"]
        lines.append(
            f"\nregistered `{d['name']}` version {d['challenger_version']}: "
            + ("**champion**" if d["promoted"] else "challenger")
            + f" ({d['reason']})"
        )
    lines.append(
        f"\nMLflow parent run: [{result.parent_run_id}]({run_url(result.parent_run_id)}) (plots/: optimisation "
        "history, parallel coordinates, parameter importances; tables/leaderboard)"
    )
    head = result.leaderboard.drop(columns=["run_id"]).head(10)
    lines += ["", "| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in head.itertuples(index=False)]
    return str(create_markdown_artifact(markdown="\n".join(lines), key=key, description="Sweep leaderboard"))
