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
    assert {"epoch", "rank", "compute_s", "comm_s_split", "comm_s_gather", "comm_s_total", "bytes_sent_split",
            "bytes_recv_gather", "bytes_sent_total", "peak_mem_bytes", "chunks", "overlap_s", "cpu_s",
            "peak_mem_nn", "peak_mem_propagate"} <= set(table.columns)
    s = tracking.summarize(res)
    assert s["epochs_run"] == 4
    assert s["compute_s_max"] == pytest.approx(0.11) and s["compute_s_min"] == pytest.approx(0.10)
    assert s["compute_balance"] == pytest.approx(1.1)
    assert s["bytes_sent_per_epoch_max"] == 4064 and s["bytes_sent_per_epoch_min"] == 3064
    assert s["bytes_balance"] == pytest.approx(4064 / 3064)
    assert s["final_test_metric"] == 0.55 and s["best_epoch"] == 3


def test_epoch_and_worker_metrics_skip_missing_values() -> None:
    m = tracking.epoch_metrics(from_dict(epoch_record(1, evaluated=False)))
    assert "test_metric" not in m and m["loss"] == 1.0
    assert m["workers/compute_s_max"] == pytest.approx(0.11)
    w = tracking.worker_metrics(from_dict(epoch_record(0)).workers[1])
    assert w["bytes_sent/split"] == 2000 and w["comm_s_total"] == pytest.approx(0.051)
    assert w["chunks"] == 4 and w["overlap_s"] == pytest.approx(0.01) and w["peak_mem/propagate"] == 100_000_001
    assert "nn_device" not in w and "overlapped" not in w, "metrics are numbers; placement is in the params"


def test_plots_are_png(tmp_path: Path) -> None:
    res = read_results(write_results(tmp_path / "r.jsonl"))
    for plot in (tracking.plot_curves, tracking.plot_workers):
        out = plot(res, tmp_path / f"{plot.__name__}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_run_logs_parent_children_artifacts(tmp_path: Path) -> None:
    results = write_results(tmp_path / "r.jsonl", epochs=3, ranks=2)
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    meta = {"name": "fake-graph", "fingerprint": "f" * 16, "num_nodes": 10}
    with tracking.start_training_run({"model": "gcn", "epochs": 3, "store": str(tmp_path)}, world_size=2,
                                     store_meta=meta, store_path=tmp_path, flow_run_id="flow-123",
                                     system_metrics_interval_s=0.5) as run:
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
    assert "workers/bytes_sent_max" in parent.data.metrics
    children = run.children()
    assert sorted(ch.data.tags["ntp.rank"] for ch in children) == ["0", "1"]
    assert all(ch.info.status == "FINISHED" for ch in children)
    assert len(c.get_metric_history(children[0].info.run_id, "comm_s/gather")) == 3
    paths = {a.path for d in ("plots", "timing", "model", "config") for a in c.list_artifacts(run.run_id, d)}
    assert {"plots/curves.png", "plots/workers.png", "timing/worker_timing.parquet", "timing/worker_timing.csv",
            "model/model.pt", "model/model.json", "config/config.json", "config/config.yaml"} <= paths
    ds = parent.inputs.dataset_inputs[0].dataset
    assert ds.digest == "f" * 16 and ds.name == "fake-graph" and str(tmp_path) in ds.source
    from tests.pipeline.conftest import ROOT

    assert parent.info.artifact_uri.startswith((ROOT / "mlartifacts").resolve().as_uri())  # not ./mlruns
    path, info = tracking.download_model(run.run_id, tmp_path / "dl")
    assert path.read_bytes() == b"weights" and info["config"]["model"] == "gcn"


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
    with tracking.start_training_run({"model": "gcn"}, world_size=1, experiment="evals",
                                     system_metrics=False) as run:
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
