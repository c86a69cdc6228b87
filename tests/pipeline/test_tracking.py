"""ntp.run.tracking: results parsing, summaries, plots and MLflow runs from hand-written results files."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntp.records import from_dict, read_results
from ntp.run import tracking
from tests.pipeline.fakes import epoch_record, write_results


def test_read_results_ignores_truncated_last_line(tmp_path: Path) -> None:
    res = read_results(write_results(tmp_path / "r.jsonl", epochs=3, final=False, truncated=True))
    assert [e.epoch for e in res.epochs] == [0, 1, 2]
    assert res.final is None and res.world_size == 2
    assert read_results(tmp_path / "missing.jsonl").epochs == []


def test_timing_table_and_summary(tmp_path: Path) -> None:
    res = read_results(write_results(tmp_path / "r.jsonl", epochs=4, ranks=2))
    table = tracking.timing_table(res)
    assert len(table) == 8
    assert {
        "epoch",
        "rank",
        "compute_s",
        "comm_s_split",
        "comm_s_gather",
        "comm_s_total",
        "bytes_sent_split",
        "bytes_recv_gather",
        "bytes_sent_total",
        "peak_mem_bytes",
        "chunks",
        "overlap_s",
        "cpu_s",
        "peak_mem_nn",
        "peak_mem_propagate",
    } <= set(table.columns)
    s = tracking.summarize(res)
    assert s["epochs_run"] == 4
    assert s["compute_s_max"] == pytest.approx(0.11) and s["compute_s_min"] == pytest.approx(0.10)
    assert s["compute_balance"] == pytest.approx(1.1)
    assert s["bytes_sent_per_epoch_max"] == 4064 and s["bytes_sent_per_epoch_min"] == 3064
    assert s["bytes_balance"] == pytest.approx(4064 / 3064)
    assert s["final_test_metric"] == 0.55 and s["best_epoch"] == 3
    assert "comm_bytes_per_edge" not in s, "no edge count, no per-edge numbers"
    per_worker = tracking.worker_summary(res)
    assert list(per_worker.columns) == ["rank", "compute_s", "comm_s", "bytes_sent", "bytes_recv", "peak_mem_bytes"]
    assert list(per_worker["rank"]) == [0, 1] and list(per_worker["bytes_sent"]) == [3064, 4064]
    assert per_worker["comm_s"][0] == pytest.approx(0.051)


def test_bytes_per_edge_summaries(tmp_path: Path) -> None:
    res = read_results(write_results(tmp_path / "r.jsonl", epochs=4, ranks=2))
    s = tracking.summarize(res, num_edges=1000)
    assert s["comm_bytes_per_edge"] == pytest.approx((3064 + 4064) / 2 / 1000)  # sent per rank per epoch / edges
    assert s["peak_mem_bytes_per_edge"] == pytest.approx(100_000_001 / 1000)  # the largest rank's peak / edges
    assert s["host_bytes_per_edge"] == pytest.approx((300_000 + 300_001) / 1000), "one machine: its ranks' PSS summed"
    assert s["topology_bytes_per_edge"] == 8.0
    four = tracking.summarize(read_results(write_results(tmp_path / "r4.jsonl", epochs=2, ranks=4)), num_edges=1000)
    assert four["host_bytes_per_edge"] == pytest.approx((4 * 300_000 + 6) / 2 / 1000), "per machine, 2 machines"


def test_parent_epoch_metrics_are_the_key_curves_only() -> None:
    m = tracking.epoch_metrics(from_dict(epoch_record(1, evaluated=False)))
    assert m == {"loss": 1.0, "epoch_s": pytest.approx(0.21)}
    m = tracking.epoch_metrics(from_dict(epoch_record(0)))
    assert set(m) == {"loss", "train_metric", "valid_metric", "test_metric", "epoch_s"}, "nothing per worker"
    w = tracking.worker_metrics(from_dict(epoch_record(0)).workers[1])
    assert w["bytes_sent/split"] == 2000 and w["comm_s_total"] == pytest.approx(0.051)
    assert w["chunks"] == 4 and w["overlap_s"] == pytest.approx(0.01) and w["peak_mem/propagate"] == 100_000_001
    assert "nn_device" not in w and "overlapped" not in w, "metrics are numbers; placement is in the params"


def test_plots_are_png(tmp_path: Path) -> None:
    res = read_results(write_results(tmp_path / "r.jsonl"))
    for plot in (tracking.plot_curves, tracking.plot_workers, tracking.plot_memory):
        out = plot(res, tmp_path / f"{plot.__name__}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_peaks_by_phase_per_rank(tmp_path: Path) -> None:
    from ntp.run.tracking.plots import memory_peaks

    res = read_results(write_results(tmp_path / "r.jsonl", ranks=2))
    assert memory_peaks(res) == {
        0: {"nn": 90_000_000, "propagate": 100_000_000},
        1: {"nn": 90_000_000, "propagate": 100_000_001},
    }
    res.epochs[0].workers[0].peak_mem_by_phase = {}
    res.epochs = res.epochs[:1]
    assert memory_peaks(res)[0] == {"epoch": 100_000_000}, "no phases measured: the epoch's peak"


KEY_CURVES = {"loss", "train_metric", "valid_metric", "test_metric", "epoch_s"}


def test_training_run_logs_parent_children_artifacts(tmp_path: Path) -> None:
    results = write_results(tmp_path / "r.jsonl", epochs=3, ranks=2)
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    meta = {"name": "fake-graph", "fingerprint": "f" * 16, "num_nodes": 10, "num_edges": 1000}
    with tracking.start_training_run(
        {"model": "gcn", "epochs": 3, "store": str(tmp_path)},
        world_size=2,
        store_meta=meta,
        store_path=tmp_path,
        flow_run_id="flow-123",
        system_metrics_interval_s=0.5,
    ) as run:
        run.log_epochs(read_results(results).epochs)  # live, while a real job runs
        summary = run.log_results(results)
        run.log_model(model, config={"model": "gcn"}, store_meta=meta)
    c = run.client
    parent = c.get_run(run.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["world_size"] == "2" and parent.data.params["store_fingerprint"] == "f" * 16
    assert parent.data.tags[tracking.TAG_FLOW_RUN] == "flow-123" and parent.data.tags.get(tracking.TAG_GIT)
    assert [m.step for m in c.get_metric_history(run.run_id, "loss")] == [0, 1, 2]
    assert parent.data.metrics["final_test_metric"] == 0.55 == summary["final_test_metric"]
    assert parent.data.metrics["comm_bytes_per_edge"] == pytest.approx(3.564)
    assert parent.data.metrics["peak_mem_bytes_per_edge"] == pytest.approx(100_000.001)
    assert parent.data.metrics["bytes_sent_per_epoch_max"] == 4064, "the balance over workers is a summary"
    _assert_parent_series_are_key_curves(c, run.run_id)
    children = run.children()
    assert sorted(ch.data.tags["ntp.rank"] for ch in children) == ["0", "1"]
    assert {ch.data.tags["ntp.host"] for ch in children} == {"node-0"}, "each rank's run names its machine"
    assert all(ch.info.status == "FINISHED" for ch in children)
    for child in children:
        for key in ("compute_s", "comm_s/gather", "bytes_sent_total", "peak_mem_bytes"):
            assert len(c.get_metric_history(child.info.run_id, key)) == 3, key
    paths = {a.path for d in ("plots", "timing", "tables", "model", "config") for a in c.list_artifacts(run.run_id, d)}
    assert {
        "plots/curves.png",
        "plots/workers.png",
        "plots/memory.png",
        "timing/worker_timing.parquet",
        "timing/worker_timing.csv",
        "tables/worker_summary.json",
        "tables/worker_timing.json",
        "model/model.pt",
        "model/model.json",
        "config/config.json",
        "config/config.yaml",
    } <= paths
    ds = parent.inputs.dataset_inputs[0].dataset
    assert ds.digest == "f" * 16 and ds.name == "fake-graph" and str(tmp_path) in ds.source
    from tests.pipeline.conftest import ROOT

    assert parent.info.artifact_uri.startswith((ROOT / "mlartifacts").resolve().as_uri())  # not ./mlruns
    path, info = tracking.download_model(run.run_id, tmp_path / "dl")
    assert path.read_bytes() == b"weights" and info["config"]["model"] == "gcn"


def _assert_parent_series_are_key_curves(c, run_id: str) -> None:
    """Per-epoch series (more than one point) in the parent: the key curves, never anything per worker."""
    metrics = c.get_run(run_id).data.metrics
    assert not [k for k in metrics if k.startswith("workers/")]
    series = {k for k in metrics if not k.startswith("system/") and len(c.get_metric_history(run_id, k)) > 1}
    assert series == KEY_CURVES


def test_tables_are_native_mlflow_tables(tmp_path: Path) -> None:
    import json

    results = write_results(tmp_path / "r.jsonl", epochs=3, ranks=2)
    with tracking.start_training_run({"model": "gcn"}, world_size=2, experiment="tables", system_metrics=False) as run:
        run.log_results(results)
        run.log_results(results)  # again (partial, then final results): the tables are replaced, not appended
    logged = json.loads(run.client.get_run(run.run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "tables/worker_summary.json", "type": "table"} in logged
    per_worker = run.client.load_table(run.experiment_id, "tables/worker_summary.json", run_ids=[run.run_id])
    assert list(per_worker["rank"]) == [0, 1] and list(per_worker["bytes_sent"]) == [3064, 4064]
    timing = run.client.load_table(run.experiment_id, "tables/worker_timing.json", run_ids=[run.run_id])
    assert len(timing) == 6 and "comm_s_gather" in timing.columns


def test_failed_training_leaves_run_failed(tmp_path: Path) -> None:
    results = write_results(tmp_path / "r.jsonl", epochs=2, final=False, truncated=True)
    with pytest.raises(RuntimeError, match="rank 1 crashed"):
        with tracking.start_training_run({"model": "gcn"}, world_size=2, experiment="failures") as run:
            run.log_epochs(read_results(results).epochs)
            run.log_results(results)
            raise RuntimeError("rank 1 crashed")
    parent = run.client.get_run(run.run_id)
    assert parent.info.status == "FAILED"
    assert "rank 1 crashed" in parent.data.tags[tracking.TAG_ERROR]
    assert len(run.client.get_metric_history(run.run_id, "loss")) == 2


def test_log_evaluation_into_run_or_new_run(tmp_path: Path) -> None:
    with tracking.start_training_run({"model": "gcn"}, world_size=1, experiment="evals", system_metrics=False) as run:
        pass
    metrics = {"train": 0.9, "valid": 0.8, "test": 0.7, "metric": "acc"}
    assert tracking.log_evaluation(run.run_id, metrics) == run.run_id
    assert run.client.get_run(run.run_id).data.metrics["eval/test"] == 0.7
    new = tracking.log_evaluation(None, metrics, model_path="m.pt", store=str(tmp_path), experiment="evals")
    r = run.client.get_run(new)
    assert r.info.status == "FINISHED" and r.data.tags[tracking.TAG_KIND] == "evaluate"
    assert r.data.metrics["eval/valid"] == 0.8


def test_tracking_uri_default_is_sqlite_in_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("NTP_DATA_DIR", str(tmp_path / "d"))
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'd' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking.tracking_uri() == "http://mlflow.example:5000"


def test_experiments_are_marked_model_training(tmp_path: Path) -> None:
    c = tracking.client()
    exp = c.get_experiment(tracking.experiment_id("kind-test"))
    assert exp.tags[tracking.TAG_EXPERIMENT_KIND] == tracking.EXPERIMENT_KIND == "custom_model_development"
    old = c.create_experiment("kind-old", artifact_location=(tmp_path / "a").as_uri())  # made by an older ntp
    assert tracking.experiment_id("kind-old") == old
    assert c.get_experiment(old).tags[tracking.TAG_EXPERIMENT_KIND] == "custom_model_development"
    c.set_experiment_tag(old, tracking.TAG_EXPERIMENT_KIND, "genai_development")  # the user's choice stays
    tracking.experiment_id("kind-old")
    assert c.get_experiment(old).tags[tracking.TAG_EXPERIMENT_KIND] == "genai_development"


def test_run_url_uses_the_ui_address_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with tracking.start_training_run({"model": "gcn"}, world_size=1, experiment="links", system_metrics=False) as run:
        pass
    page = f"/#/experiments/{run.experiment_id}/runs/{run.run_id}?workflowType=machine_learning"
    monkeypatch.delenv(tracking.UI_URL_ENV, raising=False)
    hint = tracking.run_url(run.run_id)
    assert f"--port 5000  ->  http://127.0.0.1:5000{page}" in hint and "$NTP_MLFLOW_UI_URL" in hint
    monkeypatch.setenv(tracking.UI_URL_ENV, "http://gpu-box:8080/")
    hint = tracking.run_url(run.run_id)
    assert f"mlflow ui --backend-store-uri {tracking.tracking_uri()} --host gpu-box --port 8080" in hint
    assert f"->  http://gpu-box:8080{page}" in hint


def test_run_url_of_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking.mlflow_store, "client", lambda uri=None: _FakeClient())
    monkeypatch.delenv(tracking.UI_URL_ENV, raising=False)
    url = tracking.run_url("r1", "http://mlflow.example:5000/")
    assert url == "http://mlflow.example:5000/#/experiments/7/runs/r1?workflowType=machine_learning"
    monkeypatch.setenv(tracking.UI_URL_ENV, "https://mlflow.example/ui")  # a UI behind a proxy
    assert tracking.run_url("r1", "http://mlflow.example:5000").startswith("https://mlflow.example/ui/#/experiments/7/")


class _FakeClient:
    def get_run(self, run_id: str):
        from types import SimpleNamespace

        return SimpleNamespace(info=SimpleNamespace(experiment_id="7"))


def test_system_metrics_without_a_gpu() -> None:
    import time

    import pynvml  # noqa: F401  (nvidia-ml-py, the tracking extra: GPU metrics where there is a GPU)
    import torch

    from ntp.run.tracking.runs import _monitor

    with tracking.start_training_run(
        {"model": "gcn"}, world_size=1, experiment="sysmetrics", system_metrics=False
    ) as run:
        monitor = _monitor(run.run_id, run.uri, 0.1)
        assert monitor is not None
        deadline = time.time() + 20
        while "system/cpu_utilization_percentage" not in run.client.get_run(run.run_id).data.metrics:
            assert time.time() < deadline, "no system metrics"
            time.sleep(0.2)
        monitor.finish()
    metrics = run.client.get_run(run.run_id).data.metrics
    has_gpu = any(k.startswith("system/gpu_") for k in metrics)
    assert has_gpu == torch.cuda.is_available()
