"""Start a training job: in this process (``--mode single``) or as a torchrun job whose output is streamed.

The torchrun job runs in its own process group: on a timeout or an interrupt the whole group is killed, so no
worker outlives the launcher. When a rank fails, torchrun stops the others and the launcher raises
:class:`TrainingFailed` with that rank's traceback in its message.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ntp.config import ConfigError, TrainConfig, config_to_argv

#: Markers around a failing rank's traceback (printed by ntp.train, found by failure_message).
FAILURE_BEGIN, FAILURE_END = "===== ntp rank failed", "===== end of ntp rank failure"

LineSink = Callable[[str], None]


class TrainingFailed(RuntimeError):
    """The training job failed or timed out; the message holds the failing rank's traceback."""


@dataclass
class LaunchResult:
    returncode: int
    results_path: Path
    model_path: Path | None
    wall_s: float


def default_nproc() -> int:
    """All visible GPUs, else 2 CPU processes (or 1 on a one-core machine)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        pass
    return min(2, os.cpu_count() or 1)


def torchrun_command(cfg: TrainConfig, nproc: int, *, nnodes: int = 1, node_rank: int = 0,
                     rdzv_endpoint: str | None = None) -> list[str]:
    """The torchrun command line for ``cfg``. One node: standalone rendezvous on a free local port."""
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc} must be at least 1")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} must be in [0, --nnodes {nnodes})")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--max-restarts=0"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ConfigError("multi-node training needs --rdzv-endpoint HOST:PORT (the same on every node)")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    return cmd + ["-m", "ntp.train", *config_to_argv(cfg)]


def launch_training(cfg: TrainConfig, nproc: int = 1, *, nnodes: int = 1, node_rank: int = 0,
                    rdzv_endpoint: str | None = None, timeout_s: float | None = None, on_line: LineSink = print,
                    env: dict[str, str] | None = None) -> LaunchResult:
    """Run the job to completion; raises :class:`TrainingFailed` (with the failing rank's traceback) on failure."""
    _check_store(cfg)
    if not cfg.results:
        cfg = cfg.replace(results=str(Path(tempfile.mkdtemp(prefix="ntp-results-")) / "results.jsonl"))
    t0 = time.perf_counter()
    if cfg.mode == "single":
        if nproc * nnodes != 1:
            raise ConfigError(f"--mode single runs one process; drop --nproc {nproc} or use --mode tp")
        _run_in_process(cfg)
    else:
        _run_torchrun(torchrun_command(cfg, nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint),
                      timeout_s, on_line, env)
    model = Path(cfg.model_out) if cfg.model_out else None
    return LaunchResult(0, Path(cfg.results), model if model and model.exists() else None, time.perf_counter() - t0)


def _check_store(cfg: TrainConfig) -> None:
    """Fail on a missing or damaged store here, with the store's own message, before any worker starts."""
    if not cfg.store:
        raise ConfigError("no graph store given; pass --store PATH (build one with `ntp data prepare NAME`)")
    from storage import open_store

    open_store(cfg.store)


def _run_in_process(cfg: TrainConfig) -> None:
    from ntp.train import run

    try:
        run(cfg)
    except ConfigError:
        raise
    except Exception as exc:
        raise TrainingFailed(f"training failed: {type(exc).__name__}: {exc}") from exc


def _run_torchrun(cmd: list[str], timeout_s: float | None, on_line: LineSink, env: dict[str, str] | None) -> None:
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    full_env.setdefault("OMP_NUM_THREADS", "1")  # ntp.train sets its own thread count; this silences torchrun's notice
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=full_env, start_new_session=True)
    tail: deque[str] = deque(maxlen=400)
    reader = threading.Thread(target=_pump, args=(proc, on_line, tail), daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(timeout=5)
        raise TrainingFailed(f"training timed out after {timeout_s:.0f} s and was stopped; raise the timeout or "
                             f"look at the last output:\n" + "\n".join(list(tail)[-40:])) from None
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        _kill_group(proc)  # no orphan: whatever is left of the job's process group goes
    reader.join(timeout=5)
    if returncode != 0:
        raise TrainingFailed(failure_message(returncode, list(tail)))


def _pump(proc: subprocess.Popen, on_line: LineSink, tail: deque) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        on_line(line)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def failure_message(returncode: int, lines: list[str]) -> str:
    """The first failing rank's traceback (between the markers ntp.train prints), else the output's tail."""
    starts = [i for i, line in enumerate(lines) if FAILURE_BEGIN in line]
    # a crashed rank makes its peers fail too ("connection closed by peer"): prefer the rank that failed first-hand
    first_hand = [i for i in starts if not _is_peer_failure(lines, i)]
    begin = (first_hand or starts or [None])[0]
    if begin is not None:
        end = next((i for i in range(begin, len(lines)) if FAILURE_END in lines[i]), len(lines) - 1)
        body = "\n".join(lines[begin : end + 1])
    else:
        body = "\n".join(lines[-40:])
    return f"training job failed (exit code {returncode}):\n{body}"


def _is_peer_failure(lines: list[str], begin: int) -> bool:
    end = next((i for i in range(begin, len(lines)) if FAILURE_END in lines[i]), len(lines))
    text = "\n".join(lines[begin:end])
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "DistBackendError"))
