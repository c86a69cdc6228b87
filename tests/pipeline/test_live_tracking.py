"""Plain `ntp train` is tracked like the pipeline, and MLflow shows the curves while the job runs."""

from __future__ import annotations

import threading
import time

from ntp.run import tracking
from ntp.run.cli import main as ntp_main

EPOCHS = 300


def _watch(experiment: str, stop: threading.Event, seen: list[tuple[str, int]]) -> None:
    """What a person refreshing the MLflow UI sees: the run's status and how many loss points it has."""
    c = tracking.client()
    while not stop.wait(0.2):
        exp = c.get_experiment_by_name(experiment)
        runs = c.search_runs([exp.experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'") if exp else []
        if runs:
            seen.append((runs[0].info.status, len(c.get_metric_history(runs[0].info.run_id, "loss"))))


def test_ntp_train_logs_epochs_to_mlflow_as_they_happen(cora_store: str, capsys) -> None:
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=("live-test", stop, seen), daemon=True)
    watcher.start()
    try:
        code = ntp_main(
            [
                "train",
                "--store",
                cora_store,
                "--nproc",
                "2",
                "--device",
                "cpu",
                "--epochs",
                str(EPOCHS),
                "--hidden",
                "16",
                "--eval-every",
                "10",
                "--experiment",
                "live-test",
            ]
        )
    finally:
        time.sleep(0.5)
        stop.set()
        watcher.join()
    assert code == 0
    out = capsys.readouterr().out
    assert f"epoch {EPOCHS}/{EPOCHS}" in out and "test acc" in out and "mlflow run:" in out
    partial = [n for status, n in seen if status == "RUNNING" and 0 < n < EPOCHS]
    assert partial, f"no partial curve seen while running: {seen[:5]} ... {seen[-5:]}"
    c = tracking.client()
    run = c.search_runs([c.get_experiment_by_name("live-test").experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")[
        0
    ]
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("gcn-decoupled-tp-2-")
    assert [m.step for m in c.get_metric_history(run.info.run_id, "loss")] == list(range(EPOCHS)), "each epoch once"
    assert run.data.metrics["final_test_metric"] > 0.5
