"""`ntp sweep` for real: an Optuna study of `ntp train` jobs on Cora, 2 at a time, tracked in MLflow; stopped with
Ctrl-C and resumed by the same command."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ntp.errors import ConfigError
from ntp.run.sweep.space import parse_space
from ntp.run.sweep.trial import split_gpus
from tests.pipeline.conftest import PROJECT
from tests.processes import processes_with

SPACE = """\
fixed: {epochs: 5, mode: single, model: gcn, eval_every: 1}
space:
  lr: {low: 1.0e-6, high: 0.05, log: true}   # most of this range learns nothing in 5 epochs: pruned
  hidden: [16, 32]
"""


def _sweep_command(store: str, space: str, marker: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "sweep",
        "--store",
        store,
        "--space",
        space,
        "--study-name",
        marker,
        "--trials",
        "6",
        "--parallel",
        "2",
        "--seed",
        "1",
        "--experiment",
        "sweep-test",
        "--register",
        "cora-sweep",
        "--device",
        "cpu",
    ]


def test_sweep_interrupted_resumes_prunes_and_registers_the_best(cora_store, tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient

    from ntp.run.sweep.study import default_storage, finished_trials
    from storage import open_store

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    marker = f"sweep-{tmp_path.name}"
    cmd = _sweep_command(cora_store, str(space), marker)
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in first.stdout:  # Ctrl-C once a trial has ended (the other one is still training)
        seen.append(line)
        if line.startswith("[sweep] trial"):
            first.send_signal(signal.SIGINT)
            break
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 130, "".join(seen) + out
    assert "run the same command again to resume" in out
    assert not processes_with(f"{marker}-trial-"), "a trial's job outlived the interrupted sweep"

    client = MlflowClient()
    study = optuna.load_study(study_name=marker, storage=default_storage())
    before = finished_trials(study)
    assert 1 <= before < 6
    parent = study.user_attrs["mlflow_parent_run_id"]
    assert client.get_run(parent).info.status == "KILLED"

    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=540)
    assert second.returncode == 0, second.stdout + second.stderr
    study = optuna.load_study(study_name=marker, storage=default_storage())
    assert finished_trials(study) == 6  # continued, not restarted: the first run's trials count
    states = [t.state.name for t in study.trials]
    # how many the median pruner stops depends on which trials finish first (2 run at once): the test below
    # prunes one for certain; here, every trial ended as a trial may (the interrupted one FAIL, then run again)
    assert states.count("COMPLETE") >= 1 and set(states) <= {"COMPLETE", "PRUNED", "FAIL"}, states
    assert study.user_attrs["mlflow_parent_run_id"] == parent

    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and tags.`ntp.kind` = 'train'"
    )
    by_state = {}
    for child in children:
        by_state.setdefault(child.data.tags.get("ntp.sweep.state", child.info.status), []).append(child)
    assert len(by_state.get("COMPLETE", [])) + len(by_state.get("PRUNED", [])) == 6, by_state.keys()
    assert all(c.info.status != "RUNNING" for c in children)
    artifacts = {a.path for folder in ("plots", "tables") for a in client.list_artifacts(parent, folder)}
    assert {
        "plots/optimization_history.png",
        "plots/parallel_coordinate.png",
        "plots/param_importances.png",
        "tables/leaderboard.json",
        "tables/leaderboard.csv",
    } <= artifacts
    best = study.best_trial
    assert run.data.metrics["best_valid_metric"] == pytest.approx(best.value)
    assert run.data.tags["ntp.sweep.best_run_id"] == best.user_attrs["mlflow_run_id"]

    version = client.get_model_version_by_alias("cora-sweep", "champion")
    assert client.get_model_version_by_alias("cora-sweep", "challenger").version == version.version
    assert version.run_id == best.user_attrs["mlflow_run_id"]
    assert version.tags["ntp.store_fingerprint"] == open_store(cora_store).meta.fingerprint
    assert run.data.tags["ntp.champion.decision"] == "promoted"


def test_a_handed_trial_below_the_median_prunes_itself_through_the_storage(cora_store, tmp_path):
    """A trial asked by the controller and trained by a runner that knows only the storage, the study and the trial's
    number (what a `sweep-trial` flow run does): the median pruner, rebuilt from the study, stops a trial that learns
    nothing (lr 1e-7) after its warm-up (a tenth of the epochs) against two finished trials at 0.99; its process group
    is gone, its run KILLED and tagged, the trial PRUNED in the storage. A trial whose runner died without telling
    ends FAIL, and a run it left RUNNING is ended."""
    import optuna
    from mlflow.tracking import MlflowClient

    from ntp.run.sweep import remote
    from ntp.run.sweep.space import parse_space
    from ntp.run.sweep.study import SweepSettings, start_sweep
    from ntp.run.sweep.trial import TAG_STATE

    epochs = 300  # long enough that the stop, not the end, ends it
    name, storage = f"prune-{tmp_path.name}", f"sqlite:///{tmp_path / 'optuna.db'}"
    fixed = {"epochs": epochs, "mode": "single", "model": "gcn", "lr": 1e-7}
    settings = SweepSettings(
        space=parse_space({"fixed": fixed, "space": {"hidden": [16]}}),
        store=cora_store,
        study_name=name,
        storage=storage,
        experiment="prune-test",
        launch_args=["--device", "cpu"],
        device="cpu",
    )
    sweep = start_sweep(settings, on_line=lambda line: None)  # the controller's side
    for _ in range(2):
        sweep.study.add_trial(
            optuna.trial.create_trial(value=0.99, intermediate_values=dict.fromkeys(range(epochs), 0.99))
        )
    remote.publish_job(sweep)
    number, params = remote.ask(sweep)
    assert params == {"hidden": 16}

    trial = remote.run_handed_trial(name, number, storage)  # the runner's side: nothing but these three
    assert trial.state.name == "PRUNED" and trial.last_step == 30  # pruned after epoch 31
    assert remote.trial_state(sweep, number).state.name == "PRUNED"
    assert not processes_with(f"{name}-trial-"), "a pruned trial's job outlived it"
    client = MlflowClient()
    run = client.get_run(trial.user_attrs["mlflow_run_id"])
    assert run.data.tags[TAG_STATE] == "PRUNED" and run.info.status == "KILLED"
    assert run.data.tags["mlflow.parentRunId"] == sweep.parent_run_id

    number, _ = remote.ask(sweep)  # a runner that died (SIGKILL) without telling the study, its run left RUNNING
    left = client.create_run(run.info.experiment_id, tags={"mlflow.parentRunId": sweep.parent_run_id}).info.run_id
    assert remote.fail_unfinished(sweep, number, "its flow run ended CRASHED")
    assert not remote.fail_unfinished(sweep, number, "again")  # a trial its runner ended is left as it is
    failed = remote.trial_state(sweep, number)
    assert failed.state.name == "FAIL" and failed.user_attrs["error"] == "its flow run ended CRASHED"
    assert sweep.close_trial_runs() == [left] and client.get_run(left).info.status == "KILLED"
    client.set_terminated(sweep.parent_run_id)


def test_a_sweep_ends_the_runs_its_trials_left_running(cora_store, tmp_path):
    """A trial's job killed before it could end its MLflow run (SIGKILL after its grace, on a loaded machine) leaves
    the run RUNNING: `ntp sweep` ends such runs KILLED, tagged FAIL, once its trials have ended, and says so; here
    when it resumes a study with no trial left to run. A pruned trial's run, which its trial tagged PRUNED before
    its job's grace passed, stays PRUNED (tagged FAIL, the interrupted sweep test once counted 4 of its 6 trials)."""
    import optuna
    from mlflow.tracking import MlflowClient

    from ntp.run.sweep.study import SweepSettings, optimize, start_sweep
    from ntp.run.sweep.trial import TAG_STATE

    settings = SweepSettings(
        space=parse_space({"fixed": {"epochs": 1, "mode": "single"}, "space": {"hidden": [16]}}),
        store=cora_store,
        study_name=f"left-{tmp_path.name}",
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        n_trials=1,
        experiment="left-test",
        device="cpu",
    )
    first = start_sweep(settings, on_line=lambda line: None)
    first.study.add_trial(optuna.trial.create_trial(value=0.5))  # the trial ran; its job was killed at the end
    client = MlflowClient()
    experiment = client.get_run(first.parent_run_id).info.experiment_id
    left = client.create_run(experiment, tags={"mlflow.parentRunId": first.parent_run_id}).info.run_id
    pruned = client.create_run(
        experiment, tags={"mlflow.parentRunId": first.parent_run_id, TAG_STATE: "PRUNED"}
    ).info.run_id
    lines: list[str] = []
    sweep = optimize(settings, on_line=lines.append)
    run = client.get_run(left)
    assert run.info.status == "KILLED" and run.data.tags[TAG_STATE] == "FAIL", run.info.status
    assert any(left in line and "left RUNNING" in line for line in lines), lines
    run = client.get_run(pruned)
    assert run.info.status == "KILLED" and run.data.tags[TAG_STATE] == "PRUNED", (run.info.status, run.data.tags)
    client.set_terminated(sweep.parent_run_id)


def test_the_parent_runs_best_value_is_the_best_in_whatever_order_trials_end(tmp_path):
    """Two trials at once end out of their numbers' order: the parent run's ``best_valid_metric`` (the curve's last
    point, which MLflow's runs table shows) is the best trial's value after each trial's report and after the
    sweep's final one (stepped by trial number, a trial that ended before a lower-numbered best one had the last
    word: a resumed sweep showed 0.41 for a best of 0.782)."""
    import optuna
    from mlflow.tracking import MlflowClient

    from ntp.run.sweep.report import log_report
    from ntp.run.sweep.study import Sweep

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.create_run(client.create_experiment("order")).info.run_id
    study = optuna.create_study(direction="maximize")
    best, early = study.ask(), study.ask()  # trials 0 and 1; 1 ends first
    sweep = Sweep(None, study, parent, "order", None, client, 0, on_line=lambda line: None)
    for trial, value in ((early, 0.41), (best, 0.782)):
        study.tell(trial, value)
        sweep.report(study, study.trials[trial.number])
    assert client.get_run(parent).data.metrics["best_valid_metric"] == 0.782
    log_report(study, parent, client, warn=lambda message: None)
    assert client.get_run(parent).data.metrics["best_valid_metric"] == 0.782
    steps = [m.step for m in client.get_metric_history(parent, "best_valid_metric")]
    assert steps == sorted(steps) == [1, 2, 2], steps


def test_search_space_errors_name_the_entry_and_the_fix():
    with pytest.raises(ConfigError, match="'hiden' is no training option"):
        parse_space({"space": {"hiden": [16]}})
    with pytest.raises(ConfigError, match="set by the sweep"):
        parse_space({"space": {"store": ["a"]}})
    with pytest.raises(ConfigError, match="low < high"):
        parse_space({"space": {"lr": {"low": 0.1, "high": 0.01}}})
    with pytest.raises(ConfigError, match="grid sampler needs a finite set"):
        parse_space({"space": {"lr": {"low": 0.001, "high": 0.1}}}).grid()
    space = parse_space({"space": {"prop_steps": {"low": 1, "high": 3}, "lr": {"low": "1e-3", "high": 0.1}}})
    assert space.dimensions[0].grid() == [1, 2, 3]
    assert space.dimensions[1].low == pytest.approx(1e-3)
    # concurrent trials on GPUs never share one
    assert split_gpus(["0", "1", "2", "3", "4"], 2) == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match="lower --parallel"):
        split_gpus(["0"], 2)


def test_lineage_evaluation_runs_log_the_store_with_digest_source_and_schema(cora_store):
    from ntp.run import tracking
    from storage import open_store

    meta = open_store(cora_store).meta
    metrics = {"train": 0.9, "valid": 0.8, "test": 0.7, "metric": "acc"}
    with tracking.start_training_run(
        {"model": "gcn"}, world_size=1, store_meta=meta.to_dict(), store_path=cora_store, system_metrics=False
    ) as run:
        pass
    new = tracking.log_evaluation(None, metrics, model_path="m.pt", store=cora_store, experiment="lineage")
    assert tracking.log_evaluation(run.run_id, metrics, store=cora_store) == run.run_id  # the same store again
    # evaluated on the store it trained on: MLflow keeps the one input (a run lists a dataset once)
    for run_id, contexts in ((new, {"evaluation"}), (run.run_id, {"train"})):
        inputs = run.client.get_run(run_id).inputs.dataset_inputs
        assert len(inputs) == 1
        assert {t.value for i in inputs for t in i.tags if t.key == "mlflow.data.context"} == contexts
        ds = inputs[0].dataset
        assert ds.digest == meta.fingerprint[:36] and cora_store in ds.source
        assert f"[-1, {meta.feature_dim}]" in ds.schema.replace(" ", "") or str(meta.feature_dim) in ds.schema


@contextmanager
def _postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server on a unix socket (as the `postgres` user when the tests run as root); its URL."""
    pytest.importorskip("psycopg2")
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if found is None:
        pytest.skip("no PostgreSQL server (initdb) on this machine")
    bindir = Path(found).resolve().parent
    folder = Path(tempfile.mkdtemp(prefix="ntp-pg-"))  # short: a unix socket's path has at most 107 bytes
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_owner:
        shutil.chown(folder, "postgres")
    data = folder / "data"

    def run(*argv: object) -> None:
        out = subprocess.run([*as_owner, *map(str, argv)], capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stdout + out.stderr

    try:
        run(bindir / "initdb", "-D", data, "-U", "ntp", "--auth=trust", "-E", "UTF8")
        run(
            bindir / "pg_ctl",
            "-D",
            data,
            "-w",
            "-l",
            folder / "log",
            "-o",
            f"-k {folder} -c listen_addresses=''",
            "start",
        )
        try:
            yield f"postgresql://ntp@/postgres?host={folder}"
        finally:
            run(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_on_postgresql_the_study_shares_mlflows_database_in_a_schema_of_its_own(tmp_path, monkeypatch):
    """MLflow on PostgreSQL: the default study storage is the same database, Optuna's tables (and its alembic_version)
    in the schema `optuna`, MLflow's in `public`; both keep working."""
    import optuna
    import sqlalchemy
    from mlflow.tracking import MlflowClient

    from ntp.run.sweep.space import parse_space
    from ntp.run.sweep.study import SweepSettings, default_storage, open_study

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is relative
    with _postgres() as uri:
        client = MlflowClient(uri)
        experiment = client.create_experiment("pg")
        storage = default_storage(uri)
        assert sqlalchemy.engine.make_url(storage).database == "postgres"  # MLflow's database
        space = parse_space({"fixed": {"epochs": 2}, "space": {"hidden": [16, 32]}})
        study = open_study(SweepSettings(space=space, store="s", study_name="pg", storage=storage))
        study.tell(study.ask({"hidden": optuna.distributions.CategoricalDistribution([16, 32])}), 0.5)
        assert optuna.load_study(study_name="pg", storage=storage).best_value == 0.5
        engine = sqlalchemy.create_engine(uri)
        with engine.connect() as connection:
            tables = connection.execute(
                sqlalchemy.text("select table_schema, table_name from information_schema.tables")
            ).all()
        engine.dispose()
        assert {("optuna", "alembic_version"), ("public", "alembic_version"), ("optuna", "trials")} <= set(tables)
        assert ("public", "runs") in tables and not any(s == "optuna" and t == "runs" for s, t in tables)
        run = MlflowClient(uri).create_run(experiment)  # MLflow's schema check still passes
        assert MlflowClient(uri).get_run(run.info.run_id).info.status == "RUNNING"
