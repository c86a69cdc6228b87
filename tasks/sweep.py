"""A sweep's trial as a Prefect task (in the `sweep-trial` flow), and its leaderboard as a Prefect artifact."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from ntp.run.sweep.remote import run_handed_trial
from ntp.run.sweep.report import SweepResult
from ntp.run.tracking import run_url
from ntp.run.tracking.mlflow_store import TAG_FLOW_RUN


@task(name="trial", cache_policy=NO_CACHE, task_run_name="trial-{number}")
def train_trial(study_name: str, number: int, storage: str | None) -> dict[str, Any]:
    """Train one trial a controller asked for (``ntp.run.sweep.remote.run_handed_trial``) and tell the study."""
    logger = get_run_logger()
    trial = run_handed_trial(study_name, number, storage, tags={TAG_FLOW_RUN: str(flow_run.get_id())})
    logger.info("trial %d %s value %s params %s", trial.number, trial.state.name, trial.value, trial.params)
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
