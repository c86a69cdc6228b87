"""`ntp train --splits/--seeds`: one job per (split set, seed), children of one MLflow parent run that holds the
mean and the sample standard deviation; every run ends FINISHED (none left RUNNING)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ntp.run.cli import main as ntp_main
from ntp.run.tracking import client
from storage.prepare import prepare

NPZ = Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets" / "heterophilous" / "chameleon_filtered.npz"


@pytest.mark.skipif(not NPZ.is_file(), reason="needs ../shared/datasets/heterophilous")
def test_splits_and_seeds_are_children_of_one_parent_with_mean_and_std(tmp_path, capsys) -> None:
    store = str(prepare("chameleon", from_npz=NPZ, out=tmp_path / "store", progress=lambda m: None))
    argv = ["train", "--store", store, "--nproc", "1", "--epochs", "3", "--hidden", "8", "--experiment", "repeats"]
    assert ntp_main([*argv, "--splits", "7", "--seeds", "2", "--seed", "5", "--run-name", "rep"]) == 0
    c = client()
    exp = c.get_experiment_by_name("repeats").experiment_id
    runs = c.search_runs([exp], "tags.`ntp.kind` != 'worker'")
    (parent,) = [r for r in runs if r.info.run_name == "rep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted((r.data.tags["ntp.split"], r.data.tags["ntp.seed"]) for r in children) == [("7", "5"), ("7", "6")]
    assert {r.info.status for r in [parent, *children]} == {"FINISHED"}
    assert {(r.data.params["split"], r.data.params["splits"], r.data.params["seeds"]) for r in children} == {
        ("7", "", "0")
    }
    tests = [r.data.metrics["final_test_metric"] for r in children]
    assert parent.data.metrics["test_mean"] == pytest.approx(statistics.mean(tests))
    assert parent.data.metrics["test_std"] == pytest.approx(statistics.stdev(tests))
    assert parent.data.params["splits"] == "7" and parent.data.metrics["runs"] == 2
    out = capsys.readouterr().out
    assert "mean over 2 runs: test acc" in out and "split 7, seed 6: test acc" in out
    assert ntp_main([*argv, "--splits", "0,10", "--no-track"]) == 2, "a split set the store lacks: bad input"
