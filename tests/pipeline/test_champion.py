"""Champion and challenger through the real deployment loop: a Prefect server, the process pool, `prefect deploy
--all`, a worker. Three pipeline runs register three versions: the worse second one leaves the champion alias where
it was, the better third one moves it, and the predict deployment's trigger serves the new champion. Then a sweep:
its controller on control-pool (a worker of its own) submits one flow run per trial to gpu-pool (limit 1), 2 at once;
one trial is cancelled while it trains."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import CORA
from tests.pipeline.test_deployment import (
    UUID,
    _get,
    _prefect,
    _started,
    deployed_project,
)

pytestmark = [pytest.mark.deployment, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "cora-champion"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _post(url: str, body: dict) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _wait_run(api: str, flow_run_id: str, log: Path, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            run = _get(f"{api}/flow_runs/{flow_run_id}")
        except OSError:  # a busy server answers late now and then: ask again
            continue
        if run["state_type"] in TERMINAL:
            assert run["state_type"] == "COMPLETED", f"flow run {run['state_type']}:\n{log.read_text()[-6000:]}"
            return run
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} not done after {timeout} s:\n{log.read_text()[-4000:]}")


def _cancel_when_training(api: str, client, experiment: str, epochs: str, log: Path, timeout: float = 240) -> str:
    """Cancel the trial flow run whose training (``epochs`` epochs) is running, once its MLflow run exists; returns
    that run's id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exp = client.get_experiment_by_name(experiment)
        found = exp and client.search_runs(
            [exp.experiment_id],
            f"params.epochs = '{epochs}' and tags.`ntp.kind` = 'train' and attributes.status = 'RUNNING'",
        )
        if found:
            flow_run = found[0].data.tags["prefect.flow_run_id"]
            _post(f"{api}/flow_runs/{flow_run}/set_state", {"state": {"type": "CANCELLING"}, "force": True})
            return found[0].info.run_id
        time.sleep(0.5)
    raise AssertionError(f"no trial trained {epochs} epochs after {timeout} s:\n{log.read_text()[-4000:]}")


def _slot_spans(api: str, runs: list[dict]) -> list[tuple[datetime, datetime]]:
    """When each flow run held a slot of its pool, as Prefect counts it: from PENDING until CANCELLING or its end (the
    work-pool scheduler counts PENDING and RUNNING runs only); sorted."""
    spans = []
    for run in runs:
        states = _get(f"{api}/flow_run_states/?flow_run_id={run['id']}")
        times = sorted((datetime.fromisoformat(s["timestamp"]), s["type"]) for s in states)
        start = next(t for t, kind in times if kind == "PENDING")
        spans.append((start, next(t for t, kind in times if t > start and kind in {"CANCELLING", *TERMINAL})))
    return sorted(spans)


def _predict_runs(api: str) -> list[dict]:
    return _post(f"{api}/flow_runs/filter", {"flows": {"name": {"any_": ["predict"]}}, "sort": "START_TIME_ASC"})


def test_worse_model_keeps_the_champion_better_one_moves_it_and_triggers_predict(tmp_path: Path) -> None:
    if not CORA.is_dir():
        pytest.skip(f"{CORA} is missing")
    predictions = tmp_path / "predictions"

    def params(epochs: int, lr: float) -> dict:
        return {
            "params": {
                "dataset": {"name": "cora", "from_dir": str(CORA)},
                "training": {"epochs": epochs, "lr": lr, "hidden": 16, "eval_every": 1},
                "launch": {"nproc": 1, "device": "cpu", "job_timeout_s": 120},
                "experiment": "champion-test",
                "registered_model": MODEL,
                "predictions_out": str(predictions),
            }
        }

    from mlflow.tracking import MlflowClient

    log = tmp_path / "worker.log"
    # the workers poll every 2 s (default 10): a trial flow run waits less for the slot the previous one freed
    with deployed_project(tmp_path, PREFECT_WORKER_QUERY_SECONDS="2") as (api, mlflow_uri, env):
        client = MlflowClient(mlflow_uri)
        worker_cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu-pool"]
        with _started(worker_cmd, env, log):
            champions = []
            for epochs, lr in ((8, 0.01), (1, 1e-6), (40, 0.01)):  # decent, worse (untrained), better
                out = _prefect(
                    ["deployment", "run", "pipeline/pipeline", "--params", json.dumps(params(epochs, lr))], env
                )
                _wait_run(api, UUID.findall(out)[-1], log)
                champions.append(str(client.get_model_version_by_alias(MODEL, "champion").version))
                assert str(client.get_model_version_by_alias(MODEL, "challenger").version) == str(len(champions))
            assert champions == ["1", "1", "3"]
            deadline = time.monotonic() + 240  # the trigger's predict runs: one per champion move (versions 1 and 3)
            while time.monotonic() < deadline:
                runs = _predict_runs(api)
                if len(runs) == 2 and all(r["state_type"] in TERMINAL for r in runs):
                    break
                time.sleep(1)
            else:
                raise AssertionError(f"predict runs: {_predict_runs(api)}\n{log.read_text()[-4000:]}")
            # the sweep: its controller on control-pool submits one flow run per trial to gpu-pool (limit 1)
            (train_run,) = client.search_runs(
                [client.get_experiment_by_name("champion-test").experiment_id], "tags.`ntp.champion.decision` = 'kept'"
            )
            sweep = {
                "store": train_run.data.params["store"],
                "space": {"fixed": {"hidden": 16, "eval_every": 1}, "space": {"epochs": [3, 3000]}},
                "study_name": "deployed",
                "trials": 2,
                "parallel": 2,
                "sampler": "grid",
                "pruner": "none",
                "experiment": "sweep-deployment-test",
                "registered_model": "cora-swept",
                "launch": {"nproc": 1, "device": "cpu"},
                "poll_s": 1,
            }
            control_cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "control-pool"]
            with _started(control_cmd, env, tmp_path / "control.log"):
                out = _prefect(["deployment", "run", "sweep/sweep", "--params", json.dumps(sweep)], env)
                sweep_id = UUID.findall(out)[-1]
                cancelled = _cancel_when_training(api, client, "sweep-deployment-test", "3000", log)
                sweep_run = _wait_run(api, sweep_id, tmp_path / "control.log", timeout=300)
            assert _get(f"{api}/deployments/{sweep_run['deployment_id']}")["work_pool_name"] == "control-pool"
            trial_runs = _post(f"{api}/flow_runs/filter", {"flows": {"name": {"any_": ["sweep-trial"]}}})
            spans = _slot_spans(api, trial_runs)
            artifacts = _post(f"{api}/artifacts/filter", {"artifacts": {"key": {"like_": "pipeline-sweep-deployed"}}})
    assert len(trial_runs) == 2, trial_runs  # one flow run per trial, on gpu-pool, never two at once (limit 1)
    assert {r["work_pool_name"] for r in trial_runs} == {"gpu-pool"}
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False)), spans
    assert sorted(r["state_type"] for r in trial_runs) == ["CANCELLED", "COMPLETED"]
    assert {"pipeline-sweep-deployed", "pipeline-sweep-deployed-leaderboard"} <= {a["key"] for a in artifacts}

    assert [r["state_type"] for r in runs] == ["COMPLETED", "COMPLETED"]
    assert {r["parameters"]["model_uri"] for r in runs} == {f"models:/{MODEL}@champion"}
    last = runs[-1]
    assert last["parameters"]["out"] == str(predictions)
    assert any(predictions.iterdir())

    parent = client.search_runs(
        [client.get_experiment_by_name("sweep-deployment-test").experiment_id], "tags.`ntp.kind` = 'sweep'"
    )
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    trials = client.search_runs([parent[0].info.experiment_id], f"tags.mlflow.parentRunId = '{parent[0].info.run_id}'")
    # a child run per trial; the cancelled trial's run ended KILLED, and its trial FAIL in the study
    assert sorted(t.info.status for t in trials) == ["FINISHED", "KILLED"]
    assert {t.data.tags["prefect.flow_run_id"] for t in trials} == {r["id"] for r in trial_runs}
    assert cancelled in {t.info.run_id for t in trials if t.info.status == "KILLED"}
    import optuna

    study = optuna.load_study(study_name="deployed", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "FAIL"]
    assert (
        client.get_model_version_by_alias("cora-swept", "champion").run_id
        == parent[0].data.tags["ntp.sweep.best_run_id"]
    )

    kept = client.search_runs(
        [client.get_experiment_by_name("champion-test").experiment_id],
        "tags.`ntp.champion.decision` = 'kept'",
    )
    assert len(kept) == 1  # the worse second run, with both metrics logged
    assert kept[0].data.metrics["champion/challenger_valid"] < kept[0].data.metrics["champion/champion_valid"]
    v3 = client.get_model_version(MODEL, "3")
    # the last predict run started once version 3 was the champion: models:/NAME@champion served it
    assert datetime.fromisoformat(last["start_time"]).timestamp() * 1000 >= v3.creation_timestamp
    assert v3.tags["ntp.store_fingerprint"] and float(v3.tags["ntp.valid_metric"]) > float(
        client.get_model_version(MODEL, "1").tags["ntp.valid_metric"]
    )
