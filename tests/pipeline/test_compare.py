"""`ntp compare`: side-by-side table of training runs."""

from __future__ import annotations

import argparse

import pytest

from ntp.run import tracking
from ntp.run.compare import add_compare_command, main
from tests.pipeline.fakes import write_results


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    tmp = tmp_path_factory.mktemp("compare")
    ids = []
    for ranks in (2, 4):
        with tracking.start_training_run(
            {"model": "gcn", "mode": "tp", "nn_layers": 2, "prop_steps": 2},
            world_size=ranks,
            store_meta={"name": "cmp-graph", "fingerprint": "x"},
            experiment="compare-test",
            run_name=f"tp{ranks}",
            system_metrics=False,
        ) as run:
            run.log_results(write_results(tmp / f"r{ranks}.jsonl", epochs=3, ranks=ranks))
        ids.append(run.run_id)
    return ids


def test_compare_run_ids(two_runs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *two_runs]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert two_runs[0][:8] in lines[0] and two_runs[1][:8] in lines[0]
    for label in (
        "epoch time median (s)",
        "bytes per rank per epoch",
        "compute balance (max/min)",
        "bytes balance (max/min)",
        "final test metric",
    ):
        assert any(line.startswith(label) for line in lines), label
    world = next(line for line in lines if line.startswith("world size")).split()
    assert world[-2:] == ["2", "4"]
    assert "0.5500" in next(line for line in lines if line.startswith("final test metric"))
    assert next(line for line in lines if line.startswith("store fingerprint")).split()[-2:] == ["x", "x"]


def test_compare_experiment_lists_parent_runs_only(two_runs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--experiment", "compare-test"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.count("tp") == 2 and "rank-" not in header


def test_compare_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "no-such-run"]) == 2
    assert "no MLflow run" in capsys.readouterr().err
    assert main(["compare", "--experiment", "nope"]) == 2
    assert main(["compare"]) == 2


def test_add_compare_command_registers_func() -> None:
    parser = argparse.ArgumentParser()
    add_compare_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", "abc", "def"])
    assert args.run_ids == ["abc", "def"] and callable(args.func)
