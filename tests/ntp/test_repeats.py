"""`ntp train --splits/--seeds`: one job per (split set, seed), children of one MLflow parent run that holds the
mean and the sample standard deviation; every run ends FINISHED (none left RUNNING). `--continue` takes up a stopped
one."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from ntp.config import TrainConfig
from ntp.errors import ConfigError
from ntp.run.cli import main as ntp_main
from ntp.run.repeats import train_repeats
from ntp.run.tracking import client
from ntp.spec import resolve
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
    last = next(r.data.metrics["final_test_metric"] for r in children if r.data.tags["ntp.seed"] == "6")
    so_far = f"run 2/2: split 7, seed 6: test acc {last:.4f}; mean of 2 so far {statistics.mean(tests):.4f}"
    assert so_far in out, "each finished run prints its metric and the running mean"
    assert ntp_main([*argv, "--splits", "0,10", "--no-track"]) == 2, "a split set the store lacks: bad input"


def test_a_stopped_run_continues_under_its_parent_keeping_its_finished_children(tmp_path, capsys) -> None:
    """Ctrl-C during the third of three seeds ends the parent KILLED; `--continue` keeps the two finished children,
    trains the third under the same parent and ends it FINISHED with the summary an unstopped run gives."""
    store = str(prepare("synthetic", nodes=120, features=6, classes=3, out=tmp_path / "s", progress=lambda m: None))
    cfg = TrainConfig(store=store, seeds=3, epochs=3, hidden=8)

    def stop_at_the_third(line: str) -> None:
        if "run 3/3" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_repeats(resolve(cfg, nproc=1, device="cpu"), track=True, experiment="cont", on_line=stop_at_the_third)
    c = client()
    exp = c.get_experiment_by_name("cont").experiment_id
    (parent,) = c.search_runs([exp], "tags.`ntp.kind` = 'repeats'")
    assert parent.info.status == "KILLED"
    first = _children(c, exp, parent.info.run_id)
    assert [(r.data.tags["ntp.seed"], r.info.status) for r in first] == [("0", "FINISHED"), ("1", "FINISHED")]

    argv = ["train", "--store", store, "--seeds", "3", "--epochs", "3", "--hidden", "8", "--nproc", "1"]
    assert ntp_main([*argv, "--continue", parent.info.run_id, "--threads", "1"]) == 0  # how it runs may change
    out = capsys.readouterr().out
    assert out.count("finished before") == 2 and "run 3/3: split 0, seed 2\n" in out
    again = c.get_run(parent.info.run_id)
    children = _children(c, exp, parent.info.run_id)
    assert again.info.status == "FINISHED" and [r.data.tags["ntp.seed"] for r in children] == ["0", "1", "2"]
    assert [r.info.run_id for r in children[:2]] == [r.info.run_id for r in first]
    whole = train_repeats(resolve(cfg, nproc=1, device="cpu"), track=False, on_line=lambda line: None)
    assert [r.data.metrics["final_test_metric"] for r in children] == pytest.approx(whole.tests)
    assert again.data.metrics["test_mean"] == pytest.approx(statistics.mean(whole.tests))
    assert again.data.metrics["test_std"] == pytest.approx(statistics.stdev(whole.tests))


def test_continue_resumes_the_stopped_job_from_its_checkpoint(tmp_path, capsys) -> None:
    """Stopped in its second job after 4 of 6 epochs, a run with --checkpoint-dir continues that job from its
    checkpoint (in the parent run's folder), trains only the 2 epochs left, and ends as an unstopped run."""
    store = str(prepare("synthetic", nodes=120, features=6, classes=3, out=tmp_path / "s", progress=lambda m: None))
    ckpt = tmp_path / "ckpt"
    cfg = TrainConfig(store=store, seeds=2, epochs=6, hidden=8, checkpoint_dir=str(ckpt), checkpoint_every=2)
    second = []

    def stop_in_epoch_5_of_the_second(line: str) -> None:
        if line.startswith("[ntp] run 2/2: split 0, seed 1"):
            second.append(line)
        if second and line.startswith("epoch 5/6"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_repeats(resolve(cfg, nproc=1), track=True, experiment="resumed", on_line=stop_in_epoch_5_of_the_second)
    c = client()
    exp = c.get_experiment_by_name("resumed").experiment_id
    (parent,) = c.search_runs([exp], "tags.`ntp.kind` = 'repeats'")
    folder = ckpt / parent.info.run_id / "split0-seed1"
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-000001.pt", "ckpt-000003.pt"]
    capsys.readouterr()

    argv = ["train", "--store", store, "--seeds", "2", "--epochs", "6", "--hidden", "8", "--nproc", "1"]
    argv += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    assert ntp_main([*argv, "--continue", parent.info.run_id]) == 0
    out = capsys.readouterr().out
    assert f"resuming from {folder / 'ckpt-000003.pt'}: 4 of 6 epochs done" in out
    assert "epoch 4/6" not in out and "epoch 5/6" in out and "epoch 6/6" in out, "only the 2 epochs left train"
    children = [r for r in _children(c, exp, parent.info.run_id) if r.info.status == "FINISHED"]
    whole = train_repeats(resolve(cfg.replace(checkpoint_dir=None), nproc=1), track=False, on_line=lambda x: None)
    assert [r.data.metrics["final_test_metric"] for r in children] == pytest.approx(whole.tests)
    assert c.get_run(parent.info.run_id).info.status == "FINISHED"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--epochs", "4"], "made with other options \\(epochs '3' there, '4' here\\)"),
        (["--no-track"], "drop --no-track"),
    ],
)
def test_continue_refuses_other_options_and_no_tracking(tmp_path, capsys, extra, message) -> None:
    store = str(prepare("synthetic", nodes=60, features=4, classes=2, out=tmp_path / "s", progress=lambda m: None))
    experiment = f"refuse-{tmp_path.name}"
    argv = ["train", "--store", store, "--epochs", "3", "--hidden", "8", "--nproc", "1", "--experiment", experiment]
    assert ntp_main([*argv, "--seeds", "2", "--run-name", "two"]) == 0
    c = client()
    (parent,) = c.search_runs([c.get_experiment_by_name(experiment).experiment_id], "attributes.run_name = 'two'")
    capsys.readouterr()
    assert ntp_main([*argv, "--seeds", "2", "--continue", parent.info.run_id, *extra]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert ntp_main([*argv, "--continue", parent.info.run_id]) == 2, "one run: nothing to continue"
    assert "give the --splits/--seeds it was made with" in capsys.readouterr().err


def _children(c, exp: str, parent_id: str) -> list:
    runs = c.search_runs([exp], f"tags.mlflow.parentRunId = '{parent_id}'", order_by=["attributes.start_time ASC"])
    return [r for r in runs if r.data.tags.get("ntp.kind") == "train"]


def test_an_option_newer_than_the_stopped_run_must_be_at_its_default() -> None:
    """A run made before an option existed computed what its default computes: continuing it at the default is
    allowed, at another value refused."""
    from ntp.run.repeats import _continued
    from ntp.run.tracking import experiment_id
    from ntp.run.tracking.nested import create_parent

    c = client()
    cfg = TrainConfig(store="s", seeds=2)
    params = {**cfg.to_dict(), "children": 2}
    older = {k: v for k, v in params.items() if k != "monitor"}  # made before --monitor existed
    run_id = create_parent(c, experiment_id("older", c), kind="repeats", run_name="old", params=older)
    c.set_terminated(run_id, "KILLED")
    defaults = {k: cfg.default_of(k) for k in params if k != "children"}
    assert _continued(run_id, params, defaults) == ("older", "old", {})
    with pytest.raises(ConfigError, match="monitor 'metric' there, 'loss' here"):
        _continued(run_id, {**params, "monitor": "loss"}, defaults)
