"""The quick start's Prefect section, copy-pasted into fresh shells, trains on the synthetic graph through a real
server and worker.

`docs/quickstart.py` reads the commands from docs/quickstart.md and runs each one in a new `bash -c` shell (the short ones
on a pseudo-terminal, typing nothing, so a prompt fails the test), with a private Prefect home, data directory and
MLflow database; the server and the worker are stopped with everything they started. The first test (reading the
README only) is fast; the second is a `deployment` test.
"""

from __future__ import annotations

import subprocess

import psutil
import pytest

from tests.pipeline.conftest import PROJECT, quickstart


def test_readme_block_is_what_the_script_runs() -> None:
    qs = quickstart()
    prelude, steps = qs.readme_steps()
    assert prelude == [". .venv/bin/activate"]
    commands = [s.command for s in steps]
    assert commands[0].startswith("prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api")
    assert [s.command.split()[1:3] for s in steps if s.background] == [["server", "start"], ["worker", "start"]]
    assert "prefect deploy --all" in commands
    run = commands[-1]
    assert run.startswith("prefect deployment run pipeline/pipeline --watch") and '"name": "synthetic"' in run
    assert "../shared" not in run, "a user has only the repository"
    assert not any("export " in c for c in commands), "an export does not reach the next terminal"


@pytest.mark.deployment
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_readme_prefect_section_runs_in_fresh_shells() -> None:
    qs = quickstart()
    lines: list[str] = []
    pids: list[int] = []
    try:
        with qs.readme_session(log=lines.append, run_timeout=200) as session:
            pids = [proc.pid for _step, proc, _log in session.background]
            run = session.flow_run()
            worker_log = next(log for step, _p, log in session.background if "worker" in step.command).read_text()
            assert run["state_type"] == "COMPLETED", f"flow run {run['state_type']}:\n{worker_log[-6000:]}"
            deployment = qs.get_json(f"{session.api}/deployments/{run['deployment_id']}")
            assert deployment["work_pool_name"] == "gpu-pool" and deployment["schedules"] == []

            # prefect deploy --all again, with no stdin at all: no question, no failure
            redeploy = subprocess.run(
                ["bash", "-c", session.shell("prefect deploy --all")],
                cwd=PROJECT,
                env=session.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert redeploy.returncode == 0, redeploy.stdout + redeploy.stderr

            from mlflow.tracking import MlflowClient

            client = MlflowClient(session.mlflow_uri)
            exp = client.get_experiment_by_name("synthetic")
            runs = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{run['id']}'")
            assert len(runs) == 1 and runs[0].info.status == "FINISHED"
            assert runs[0].data.params["epochs"] == "20" and "eval/test" in runs[0].data.metrics
    except RuntimeError as exc:  # a README command failed: show what ran
        pytest.fail("\n".join(lines) + f"\n{exc}")
    assert pids and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
