"""Faults an operator causes, on real process trees and a real sqlite file: nothing is left behind, no run is left
RUNNING, concurrent first runs do not break the tracking database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ntp.run import tracking
from ntp.run.cli import TORCH_CACHE_PREFIX
from ntp.run.launch import SCRATCH_PREFIX
from ntp.run.scratch import owned_tempdir
from tests.processes import processes_with, wait_for


def _start_training(cora_store: str, results: Path, experiment: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        cora_store,
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "100000",
        "--eval-every",
        "1000",
        "--results",
        str(results),
        "--experiment",
        experiment,
    ]
    # torch sets TORCHINDUCTOR_CACHE_DIR in this process once an earlier test has built an optimiser: without it, the
    # launcher makes its own compile-cache folder, as a user's does
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: results.is_file() and results.stat().st_size > 0 or proc.poll() is not None, 120, "epochs")
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    assert len(processes_with(str(results))) >= 3, "torchrun and two workers"
    return proc


def _parent_run(experiment: str):
    c = tracking.client()
    runs = c.search_runs([c.get_experiment_by_name(experiment).experiment_id], f"tags.`{tracking.TAG_KIND}` = 'train'")
    assert len(runs) == 1
    return runs[0]


def test_sigterm_to_the_launcher_stops_the_job_and_ends_the_run_killed(cora_store: str, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    proc = _start_training(cora_store, results, "sigterm-test")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143
    wait_for(lambda: not processes_with(str(results)), 15, "the job's processes to end")
    assert time.monotonic() - t0 < 15
    assert "stopped" in proc.stderr.read()
    run = _parent_run("sigterm-test")
    assert run.info.status == "KILLED" and "SIGTERM" in run.data.tags[tracking.TAG_ERROR]


def test_sigkill_to_the_launcher_leaves_no_worker_and_the_next_run_closes_its_run(
    cora_store: str, tmp_path: Path
) -> None:
    results = tmp_path / "r.jsonl"
    proc = _start_training(cora_store, results, "sigkill-test")
    proc.kill()
    proc.wait()
    wait_for(lambda: not processes_with(str(results)), 30, "torchrun and the workers to die with their launcher")
    host = socket.gethostname()
    for prefix in (SCRATCH_PREFIX, TORCH_CACHE_PREFIX):  # the job's folder, and the command's compile cache
        left = lambda pid: list(Path(tempfile.gettempdir()).glob(f"{prefix}{host}-{pid}-*"))  # noqa: E731
        assert len(left(proc.pid)) == 1, f"a killed launcher cannot remove its {prefix}* folder"
        with owned_tempdir(prefix) as mine:  # the next launch removes it
            assert not left(proc.pid) and Path(mine) in left(os.getpid())
    assert _parent_run("sigkill-test").info.status == "RUNNING", "nobody could end it yet"
    with tracking.start_training_run(
        {"model": "gcn"}, world_size=1, experiment="sigkill-test", system_metrics=False
    ) as run:
        pass
    c = tracking.client()
    old = next(r for r in c.search_runs([run.experiment_id]) if r.info.run_id != run.run_id)
    assert old.info.status == "KILLED" and "died without ending the run" in old.data.tags[tracking.TAG_ERROR]


def test_the_scratch_sweep_keeps_other_hosts_folders_and_running_launchers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a temporary directory several hosts might share
    gone = 4_194_304 + 1  # above any pid_max: no process has it
    names = {
        f"{SCRATCH_PREFIX}{socket.gethostname()}-{gone}-a": False,
        f"{SCRATCH_PREFIX}other-host-{gone}-b": True,
        f"{SCRATCH_PREFIX}{socket.gethostname()}-{os.getppid()}-c": True,
    }
    for name in names:
        (tmp_path / name).mkdir()
    with owned_tempdir(SCRATCH_PREFIX):
        assert {name: (tmp_path / name).exists() for name in names} == names


@pytest.mark.parametrize("processes", [4])
def test_concurrent_first_runs_share_a_fresh_sqlite_store(tmp_path: Path, processes: int) -> None:
    """MLflow migrates a new sqlite schema on first use; racing processes used to leave it broken."""
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = (
        "import sys; from ntp.run import tracking; c = tracking.client(sys.argv[1]);"
        "run = c.create_run(tracking.experiment_id('race', c)); c.set_terminated(run.info.run_id)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, uri], stderr=subprocess.PIPE, text=True) for _ in range(processes)
    ]
    errors = [p.stderr.read() for p in procs if p.wait(timeout=120) != 0]
    assert not errors, errors[0][-2000:]
    c = tracking.client(uri)
    assert len(c.search_runs([c.get_experiment_by_name("race").experiment_id])) == processes


def test_an_experiment_name_cannot_escape_the_artifact_directory(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    c = tracking.client(uri)
    for name in ("..", "../..", "a/../../b"):
        location = c.get_experiment(tracking.experiment_id(name, c)).artifact_location
        assert location.startswith((tmp_path / "db" / "mlartifacts").as_uri() + "/"), (name, location)


def test_a_rank_killed_by_a_signal_is_the_one_blamed(cora_store: str, tmp_path: Path) -> None:
    """Rank 1 dies without a traceback (SIGKILL, as the OOM killer does); rank 0 only lost its peer."""
    import threading

    from ntp.config import TrainConfig
    from ntp.errors import WorkerFailed
    from ntp.run.launch import launch_training
    from ntp.spec import resolve

    results = tmp_path / "r.jsonl"

    def kill_rank_1() -> None:
        wait_for(lambda: results.is_file() and results.stat().st_size > 0, 120, "epochs")
        for pid in processes_with(str(results)):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"RANK=1" in environ:
                os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    spec = resolve(
        TrainConfig(store=cora_store, epochs=100000, results=str(results), collective_timeout_s=60),
        nproc=2,
        device="cpu",
        job_timeout_s=180,
    )
    with pytest.raises(WorkerFailed) as err:
        launch_training(spec, on_line=lambda line: None)
    message = str(err.value)
    assert "rank 1 died without a traceback, killed by a signal" in message and "SIGKILL" in message, message[:2000]


def test_a_rank_torchrun_stopped_is_not_blamed_for_one_killed_outright(tmp_path: Path) -> None:
    """torchrun orders failures by one-second timestamps: a rank it stopped (SIGTERM) writes its error file at once
    and can come first. The summary is torchrun's own formatter's, the order as the real test above once saw it."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from ntp.run.launch import failure_message

    stopped = tmp_path / "error.json"
    stopped.write_text(
        json.dumps(
            {
                "message": {
                    "message": "SignalException: Process 11 got signal: 15",
                    "extraInfo": {
                        "py_callstack": "Traceback (most recent call last):\n  ...\nSignalException",
                        "timestamp": "1",
                    },
                }
            }
        )
    )
    failures = {0: ProcessFailure(0, 11, -15, str(stopped)), 1: ProcessFailure(1, 12, -9, str(tmp_path / "none"))}
    summary = ChildFailedError("worker.py", failures).format_msg()
    assert "Root Cause (first observed failure):\n[0]:\n" in summary and "(SIGTERM)" in summary.split("Root Cause")[1]
    message = failure_message(1, ["some output"] + summary.splitlines())
    assert (
        message.splitlines()[1]
        == "rank 1 died without a traceback, killed by a signal (out of memory?); torchrun says:"
    )
    assert "SIGKILL" in message and "SIGTERM" not in message, message
    alone = {0: ProcessFailure(0, 11, -15, str(stopped))}  # stopped from outside: nothing else to blame
    assert "rank 0 died" in failure_message(1, ChildFailedError("worker.py", alone).format_msg().splitlines())


@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_stopping_ntp_pipeline_is_quick_and_leaves_no_server_or_worker(how: str, code: int, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to `ntp pipeline` mid-training: it ends within
    30 s and neither its temporary Prefect server nor torchrun nor a worker survives."""
    from tests.pipeline.conftest import CORA

    marker = str(tmp_path / "data")
    env = {**os.environ, "NTP_DATA_DIR": marker, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    cmd = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "pipeline",
        "cora",
        "--from-dir",
        str(CORA),
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "100000",
        "--eval-every",
        "1000",
        "--experiment",
        f"stop-{how}",
    ]
    # as in a terminal: its own process group, SIGINT not ignored (a background shell job would inherit SIG_IGN)
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    runs = tmp_path / "data" / "runs"
    wait_for(
        lambda: any(p.stat().st_size for p in runs.glob("*/results.jsonl")) or proc.poll() is not None,
        240,
        "training to start",
    )
    assert proc.poll() is None, proc.stderr.read()
    t0 = time.monotonic()
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == code
    assert time.monotonic() - t0 < 30
    wait_for(lambda: not processes_with(marker, "environ"), 15, "the server, torchrun and the workers to end")
