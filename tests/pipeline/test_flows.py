"""Flows in ephemeral mode with real training runs on Cora (2 ranks, tensor parallel, a few epochs)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ntp.run import tracking
from tests.pipeline.conftest import CORA, ROOT

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]

TINY = {"epochs": 3, "hidden": 16, "eval_every": 1, "dropout": 0.5, "lr": 0.01}


@pytest.fixture(scope="module")
def pipeline_result() -> dict[str, Any]:
    if not CORA.is_dir():
        pytest.skip(f"{CORA} is missing")
    from flows.params import PipelineParams
    from flows.pipeline import pipeline

    params = PipelineParams(
        dataset={"name": "cora", "from_dir": str(CORA)},
        training=TINY,
        launch={"nproc": 2, "device": "cpu", "job_timeout_s": 120},
        experiment="pipeline-test",
        registered_model="cora-pipeline",
        embeddings_out=str(ROOT / "cora-embeddings"),
    )
    return pipeline(params)


def test_pipeline_tracks_parent_children_metrics_plots_model(pipeline_result: dict[str, Any]) -> None:
    c = tracking.client()
    run = c.get_run(pipeline_result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["mode"] == "tp" and run.data.params["world_size"] == "2"
    assert run.data.params["weight_decay"] == "0.0005", "the value the ranks train with, not the option left out"
    assert run.data.params["store_fingerprint"] and run.data.tags.get(tracking.TAG_FLOW_RUN)
    assert len(c.get_metric_history(run.info.run_id, "loss")) == 3
    for key in (
        "valid_metric",
        "final_test_metric",
        "epoch_s_median",
        "compute_s_max",
        "bytes_sent_per_epoch_min",
        "comm_bytes_per_edge",
        "peak_mem_bytes_per_edge",
        "eval/train",
        "eval/valid",
        "eval/test",
    ):
        assert key in run.data.metrics, key
    assert not any(k.startswith("workers/") for k in run.data.metrics), "per-worker series are in the child runs"
    assert 0.0 <= run.data.metrics["eval/test"] <= 1.0
    assert any(k.startswith("system/") for k in run.data.metrics), "no system metrics"
    children = tracking.TrainingRun(run.info.run_id, run.info.experiment_id, c, tracking.tracking_uri()).children()
    assert sorted(ch.data.tags["ntp.rank"] for ch in children) == ["0", "1"]
    assert all(len(c.get_metric_history(ch.info.run_id, "compute_s")) == 3 for ch in children)
    paths = {
        a.path for d in ("plots", "timing", "tables", "model", "config") for a in c.list_artifacts(run.info.run_id, d)
    }
    assert {
        "plots/curves.png",
        "plots/workers.png",
        "plots/memory.png",
        "timing/worker_timing.parquet",
        "timing/worker_timing.csv",
        "tables/worker_summary.json",
        "model/model.json",
        "config/config.yaml",
    } <= paths
    assert any(p.startswith("model/") and not p.endswith(".json") for p in paths)
    assert run.inputs.dataset_inputs[0].dataset.name == "cora"


def test_pipeline_publishes_markdown_artifact(pipeline_result: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def latest() -> Any:
        async with get_client() as client:
            key = ArtifactFilterKey(any_=["pipeline-cora"])
            arts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=key))
            return arts[-1]

    import asyncio

    art = asyncio.run(latest())
    assert art.type == "markdown" and pipeline_result["run_id"] in art.data and "| world size | 2 |" in art.data


def test_pipeline_registers_the_model_and_publishes_embeddings(pipeline_result: dict[str, Any]) -> None:
    import mlflow
    import pandas as pd

    (version,) = tracking.client().search_model_versions("name = 'cora-pipeline'")
    assert version.run_id == pipeline_result["run_id"]
    # the first version is the challenger and, with no champion yet, the champion; it carries its store
    version = tracking.client().get_model_version("cora-pipeline", version.version)  # search omits aliases
    assert pipeline_result["champion"]["promoted"] and set(version.aliases) == {"challenger", "champion"}
    assert version.tags["ntp.store_fingerprint"] and float(version.tags["ntp.test_metric"]) > 0
    served = mlflow.pyfunc.load_model("models:/cora-pipeline/1")
    assert served.predict(pd.DataFrame({"node_id": [0, 1]}))["pred"].between(0, 6).all()
    embeddings = pd.read_parquet(pipeline_result["embeddings"])
    assert embeddings["node_id"].tolist() == list(range(2708)) and len(embeddings["embedding"][0]) == 16
    assert len(list(Path(pipeline_result["embeddings"]).glob("part-*.parquet"))) == 2  # the training's 2 ranks


def test_evaluate_flow_from_run_id(pipeline_result: dict[str, Any]) -> None:
    from flows.evaluate import evaluate

    metrics = evaluate(run_id=pipeline_result["run_id"])
    assert metrics["run_id"] == pipeline_result["run_id"]
    assert metrics["test"] == pytest.approx(pipeline_result["evaluation"]["test"])


def test_evaluate_flow_from_model_path(pipeline_result: dict[str, Any], tmp_path: Path) -> None:
    from flows.evaluate import evaluate

    model, _info = tracking.download_model(pipeline_result["run_id"], tmp_path)
    metrics = evaluate(model_path=str(model), store=pipeline_result["store"], experiment="pipeline-test")
    assert metrics["run_id"] != pipeline_result["run_id"]
    assert tracking.client().get_run(metrics["run_id"]).data.metrics["eval/test"] == pytest.approx(metrics["test"])


def test_crashed_rank_fails_flow_with_traceback_and_mlflow_failed(cora_store: str) -> None:
    from flows.params import LaunchOptions, TrainingOptions
    from flows.train import train
    from ntp.errors import WorkerFailed

    start = time.monotonic()
    with pytest.raises(WorkerFailed) as err:
        train(
            store=cora_store,
            training=TrainingOptions(**{**TINY, "fail_rank": 1, "fail_at_epoch": 1}),
            launch=LaunchOptions(nproc=2, device="cpu", job_timeout_s=120),
            experiment="crash-test",
        )
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"the crash took {elapsed:.0f} s to fail the flow"
    assert "Traceback" in str(err.value) and "rank 1" in str(err.value).lower()
    c = tracking.client()
    exp = c.get_experiment_by_name("crash-test")
    runs = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert "Traceback" in runs[0].data.tags[tracking.TAG_ERROR] or "rank" in runs[0].data.tags[tracking.TAG_ERROR]


def test_pipeline_command_line(cora_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.pipeline_cli import main

    code = main(
        [
            "pipeline",
            "cora",
            "--from-dir",
            str(CORA),
            "--nproc",
            "2",
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--hidden",
            "16",
            "--experiment",
            "cli-test",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    run_id = next(line.split()[-1] for line in out.out.splitlines() if line.startswith("mlflow run:"))
    assert tracking.client().get_run(run_id).info.status == "FINISHED"
    assert f"store: {cora_store}" in out.out

    code = main(
        [
            "pipeline",
            "cora",
            "--from-dir",
            str(CORA),
            "--nproc",
            "2",
            "--device",
            "cpu",
            "--epochs",
            "3",
            "--hidden",
            "16",
            "--fail-rank",
            "1",
            "--fail-at-epoch",
            "1",
            "--retries",
            "1",
            "--retry-delay",
            "0",
            "--experiment",
            "cli-fail",
        ]
    )
    assert code == 1 and "injected failure on rank 1" in capsys.readouterr().err
    c = tracking.client()
    runs = c.search_runs([c.get_experiment_by_name("cli-fail").experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"]  # the first attempt and its retry


def test_job_timeout_kills_training_and_fails_run(cora_store: str) -> None:
    from flows.params import LaunchOptions, TrainingOptions
    from flows.train import train
    from ntp.errors import WorkerFailed

    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="timed out"):
        train(
            store=cora_store,
            training=TrainingOptions(epochs=100000, hidden=16, eval_every=1000),
            launch=LaunchOptions(nproc=2, device="cpu", job_timeout_s=8),
            experiment="timeout-test",
        )
    assert time.monotonic() - start < 60, "the job outlived its timeout by far"
    c = tracking.client()
    runs = c.search_runs([c.get_experiment_by_name("timeout-test").experiment_id])
    parents = [r for r in runs if r.data.tags.get(tracking.TAG_KIND) == "train"]
    assert [r.info.status for r in parents] == ["FAILED"]
    assert all(r.info.status == "FAILED" for r in runs), "workers of a failed job (if any epoch ran) are FAILED too"


def test_input_errors_fail_at_once_and_are_never_retried(cora_store: str) -> None:
    """A memory budget that cannot work is the user's input: no rank starts and Prefect does not retry it."""
    from flows.params import LaunchOptions, TrainingOptions
    from flows.train import train
    from ntp.errors import MemoryPlanError

    start = time.monotonic()
    with pytest.raises(MemoryPlanError, match="raise --memory-budget"):
        train(
            store=cora_store,
            training=TrainingOptions(epochs=2, memory_budget="1KB"),
            launch=LaunchOptions(nproc=2, device="cpu", retries=2, retry_delay_s=0),
            experiment="plan-test",
        )
    assert time.monotonic() - start < 30
    c = tracking.client()
    runs = c.search_runs([c.get_experiment_by_name("plan-test").experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert [r.info.status for r in runs] == ["FAILED"], "one attempt, no retries"


def test_single_mode_runs_one_process(cora_store: str) -> None:
    from flows.params import LaunchOptions, TrainingOptions
    from flows.train import train

    out = train(
        store=cora_store,
        training=TrainingOptions(mode="single", epochs=2, hidden=8),
        launch=LaunchOptions(),
        experiment="single-test",
    )
    run = tracking.client().get_run(out["run_id"])
    assert run.data.params["mode"] == "single" and run.data.params["world_size"] == "1"
