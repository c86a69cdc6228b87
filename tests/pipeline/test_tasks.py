"""Task bodies via ``.fn()`` and the artifact text (no Prefect engine)."""

from __future__ import annotations

from pathlib import Path

from tasks.publish import artifact_key, results_markdown


def test_prepare_store_task_is_idempotent(cora_store: str) -> None:
    from prefect.logging import disable_run_logger

    from storage import open_store
    from tasks.prepare import prepare_store
    from tests.pipeline.conftest import CORA

    with disable_run_logger():
        again = prepare_store.fn("cora", {"from_dir": str(CORA)})
    assert again == cora_store
    assert open_store(Path(cora_store)).meta.num_nodes == 2708


def test_results_markdown_and_key() -> None:
    md = results_markdown(
        dataset="ogbn-arxiv",
        config={"model": "gcn", "arch": "decoupled", "mode": "tp"},
        summary={
            "epochs_run": 3.0,
            "best_epoch": 2.0,
            "final_test_metric": 0.71,
            "epoch_s_median": 0.25,
            "bytes_balance": 1.0,
        },
        evaluation={"train": 0.9, "valid": 0.72, "test": 0.71, "metric": "acc"},
        run_id="abc123",
        run_link="http://mlflow/#/runs/abc123",
        world_size=4,
    )
    assert "| world size | 4 |" in md and "| evaluate: test acc | 0.71 |" in md
    assert "abc123" in md and "http://mlflow/#/runs/abc123" in md
    assert artifact_key("ogbn-arxiv") == "pipeline-ogbn-arxiv" and artifact_key("My_Graph") == "pipeline-my-graph"
