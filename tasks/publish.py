"""Publish a pipeline run's results as a Prefect markdown artifact."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def results_markdown(
    *,
    dataset: str,
    config: Mapping[str, Any],
    summary: Mapping[str, float],
    evaluation: Mapping[str, Any],
    run_id: str | None,
    run_link: str | None,
    world_size: int,
) -> str:
    """The artifact's text: a header, the results table and the MLflow run link."""
    rows = [
        ("dataset", dataset),
        (
            "task",
            evaluation.get("task_type")
            + (f" of node type {evaluation['target_type']}" if evaluation.get("target_type") else "")
            if evaluation.get("task_type")
            else None,
        ),
        ("model / arch / mode", f"{config.get('model')} / {config.get('arch')} / {config.get('mode')}"),
        ("world size", world_size),
        ("epochs run", int(summary["epochs_run"]) if "epochs_run" in summary else None),
        ("best epoch", int(summary["best_epoch"]) if "best_epoch" in summary else None),
        ("best valid metric", summary.get("best_valid_metric")),
        ("final test metric (training)", summary.get("final_test_metric")),
        *[
            (f"evaluate: {split} {evaluation.get('metric', '')}".strip(), evaluation.get(split))
            for split in ("train", "valid", "test")
        ],
        ("epoch time median (s)", summary.get("epoch_s_median")),
        ("bytes per rank per epoch", summary.get("bytes_per_rank_per_epoch")),
        ("compute balance (max/min)", summary.get("compute_balance")),
        ("bytes balance (max/min)", summary.get("bytes_balance")),
    ]
    table = "\n".join(f"| {k} | {_cell(v)} |" for k, v in rows)
    return (
        f"# Pipeline results: {dataset}\n\n| quantity | value |\n|---|---|\n{table}\n\n"
        f"**MLflow run:** `{run_id}`\n\n{run_link or ''}\n"
    )


def artifact_key(dataset: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return "pipeline-" + (re.sub(r"[^a-z0-9-]+", "-", dataset.lower()).strip("-") or "results")


@task(name="publish-results", cache_policy=NO_CACHE)
def publish_results(markdown: str, key: str) -> str:
    """``create_markdown_artifact``; returns the artifact id."""
    return str(create_markdown_artifact(markdown=markdown, key=key, description="Pipeline results and MLflow run"))
