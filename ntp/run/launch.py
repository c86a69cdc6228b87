"""Start a training job from its launch spec: in this process (``single``) or as a torchrun job. Either way its
output reaches the caller's ``on_line`` line by line.

The torchrun job runs in its own session and dies with the launcher (ntp.run.processes): on a timeout, an
interrupt or SIGTERM the whole group is stopped, and if the launcher is killed outright the kernel stops torchrun,
whose workers die with it. No worker outlives the launcher. When a rank fails, torchrun stops the others and the launcher raises
:class:`WorkerFailed` with that rank's traceback in its message. What torchrun writes (its per-rank error files, torch's
compile cache) goes to a temporary folder that the launcher removes when the job ends, or the next launch on this
host if the launcher was killed outright (ntp.run.scratch).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from ntp.errors import WorkerFailed, is_input_error
from ntp.run.allocator import allocator_env
from ntp.run.flags import config_to_argv
from ntp.run.network import LOOPBACK, is_local_address, job_network_env, local_address, split_endpoint
from ntp.run.preflight import check_launch
from ntp.run.processes import spawn_group, stop_group
from ntp.run.rendezvous import C10D, STATIC
from ntp.run.scratch import owned_tempdir
from ntp.run.worker import FAILURE_BEGIN, FAILURE_END
from ntp.spec import LaunchSpec

LineSink = Callable[[str], None]
#: What a rank's traceback says when a peer, not the rank itself, failed.
PEER_FAILURES = ("Connection closed by peer", "Connection reset by peer", "DistBackendError")
#: A torchrun job's temporary folder (ntp.run.scratch: removed by the next launch if its launcher is killed).
SCRATCH_PREFIX = "ntp-torchrun-"


@dataclass
class LaunchResult:
    results_path: Path | None
    model_path: Path | None
    wall_s: float


def torchrun_command(spec: LaunchSpec, log_dir: str | None = None, program: list[str] | None = None) -> list[str]:
    """The torchrun command line of ``spec``, run through ntp.run.rendezvous (torchrun with its stores bound to one
    address). One node: a rendezvous on loopback at a free port. ``log_dir``: where torchrun keeps its files
    (default: a new ``torchelastic_*`` folder in $TMPDIR that it leaves behind). ``program``: what every rank
    runs, after ``--`` (default: the training worker with the spec's config; ntp.run.rendezvous says why)."""
    cmd = [
        sys.executable,
        "-m",
        "ntp.run.rendezvous",
        f"--nproc-per-node={spec.nproc_per_node}",
        "--max-restarts=0",
        *([f"--log-dir={log_dir}"] if log_dir else []),
    ]
    cmd += _rendezvous(spec)
    return cmd + ["--", *(program or ["-m", "ntp.run.worker", "--device", spec.device, *config_to_argv(spec.config)])]


def _rendezvous(spec: LaunchSpec) -> list[str]:
    """One node: the c10d rendezvous on loopback (torchrun's --standalone listens on every interface). Node ranks
    given: a static rendezvous at the endpoint (node 0 listens there). Left out: the c10d rendezvous, hosted by the
    node whose address the endpoint is (torchrun's own guess compares hostnames, which fails across namespaces and
    multi-homed hosts). Stores listen on the endpoint's address, or this node's (--local-addr), only."""
    if spec.nnodes == 1:
        return [
            "--nnodes=1",
            f"--rdzv-backend={C10D}",
            f"--rdzv-endpoint={LOOPBACK}:0",
            f"--rdzv-id=local-{uuid.uuid4().hex[:12]}",
            "--rdzv-conf=is_host=1",
            f"--local-addr={LOOPBACK}",
        ]
    host, port = split_endpoint(spec.rdzv_endpoint or "")
    if spec.node_rank is not None:
        return [
            f"--nnodes={spec.nnodes}",
            f"--rdzv-backend={STATIC}",
            f"--rdzv-endpoint={spec.rdzv_endpoint}",
            f"--rdzv-id={spec.job_id}",
            f"--rdzv-conf=rank={spec.node_rank}",
        ]
    # --local-addr: the address peers reach this node at (torchrun's default, the FQDN, may resolve to loopback)
    return [
        f"--nnodes={spec.nnodes}",
        f"--rdzv-backend={C10D}",
        f"--rdzv-endpoint={spec.rdzv_endpoint}",
        f"--rdzv-id={spec.job_id}",
        f"--rdzv-conf=is_host={int(leads(spec))}",
        f"--local-addr={local_address(host, port, spec.interface)}",
    ]


def leads(spec: LaunchSpec) -> bool:
    """Whether this node leads the job (hosts the rendezvous, tracks the run): node rank 0, or the node whose
    address the endpoint is."""
    if spec.nnodes == 1 or spec.node_rank is not None:
        return not spec.node_rank
    return is_local_address(split_endpoint(spec.rdzv_endpoint or "")[0])


def launch_training(spec: LaunchSpec, *, on_line: LineSink = print, env: dict[str, str] | None = None) -> LaunchResult:
    """Run the job to completion. Input errors (store, memory plan) are raised before any rank starts;
    :class:`WorkerFailed` (with the failing rank's traceback) when the job fails or times out."""
    check_launch(spec)
    t0 = time.perf_counter()
    if spec.mode == "single":
        with stdout_to(on_line):
            _run_in_process(spec)
    else:
        run_torchrun_job(spec, None, on_line=on_line, env=env)
    cfg = spec.config
    model = Path(cfg.model_out) if cfg.model_out else None
    return LaunchResult(
        Path(cfg.results) if cfg.results else None,
        model if model and model.exists() else None,
        time.perf_counter() - t0,
    )


def run_torchrun_job(
    spec: LaunchSpec, program: list[str] | None, *, on_line: LineSink = print, env: dict[str, str] | None = None
) -> None:
    """``program`` (default: training) on every rank of ``spec``'s torchrun job, to completion (WorkerFailed)."""
    network = job_network_env(spec.rdzv_endpoint, spec.interface)
    with owned_tempdir(SCRATCH_PREFIX) as tmp:
        _run_torchrun(
            torchrun_command(spec, log_dir=tmp, program=program),
            spec.job_timeout_s,
            on_line,
            {**_scratch_env(tmp), **allocator_env(), **network, **(env or {})},
        )


class _LineStream(io.TextIOBase):
    """A text stream that hands each complete line to a sink (the rest at close). The sink runs with ``outer`` as
    stdout: what it prints (a quiet caller printing the lines it keeps) goes out, not back into this stream."""

    def __init__(self, sink: LineSink, outer: TextIO) -> None:
        self.sink, self.outer, self.pending = sink, outer, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self._hand(line)
        return len(text)

    def _hand(self, line: str) -> None:
        with contextlib.redirect_stdout(self.outer):
            self.sink(line)

    def close(self) -> None:
        if self.pending:
            self._hand(self.pending)
            self.pending = ""
        super().close()


@contextlib.contextmanager
def stdout_to(on_line: LineSink):
    """What an in-process job prints goes where a torchrun job's lines go (a Prefect task's log, a quiet caller)."""
    if on_line is print:
        yield
        return
    with contextlib.closing(_LineStream(on_line, sys.stdout)) as stream, contextlib.redirect_stdout(stream):
        yield


def _run_in_process(spec: LaunchSpec) -> None:
    from ntp.engine.train.loop import run

    try:
        run(spec)
    except Exception as exc:
        if is_input_error(exc):
            raise  # the user's input, not a failed worker: keep its type (never retried)
        raise WorkerFailed(f"training failed: {type(exc).__name__}: {exc}") from exc


def _scratch_env(tmp: str) -> dict[str, str]:
    """torchrun's error file and torch's compile cache inside the job's temporary folder, unless already set."""
    scratch = {
        "TORCHELASTIC_ERROR_FILE": os.path.join(tmp, "error.json"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "torch-cache"),
    }
    return {key: value for key, value in scratch.items() if key not in os.environ}


def _run_torchrun(cmd: list[str], timeout_s: float | None, on_line: LineSink, env: dict[str, str] | None) -> None:
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    full_env.setdefault("OMP_NUM_THREADS", "1")  # the worker sets its own thread count; this silences torchrun's notice
    proc = spawn_group(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        env=full_env,
    )
    tail: deque[str] = deque(maxlen=400)
    reader = threading.Thread(target=_pump, args=(proc, on_line, tail), daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        reader.join(timeout=5)
        raise WorkerFailed(
            f"training timed out after {timeout_s:.0f} s and was stopped; raise --job-timeout or "
            f"look at the last output:\n" + "\n".join(list(tail)[-40:])
        ) from None
    except BaseException:
        stop_group(proc)
        raise
    finally:
        stop_group(proc)  # no orphan: whatever is left of the job's process group goes
        reader.join(timeout=5)
        if not reader.is_alive():
            proc.stdout.close()  # type: ignore[union-attr]
    if returncode != 0:
        raise WorkerFailed(failure_message(returncode, list(tail)))


def _pump(proc: subprocess.Popen, on_line: LineSink, tail: deque) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        on_line(line)


def failure_message(returncode: int, lines: list[str]) -> str:
    """The rank that failed first-hand: its traceback (between the markers the worker prints); else, when every
    traceback is a peer that lost its connection (the failed rank printed none: killed by a signal, out of memory),
    torchrun's root cause; else the output's tail."""
    starts = [i for i, line in enumerate(lines) if FAILURE_BEGIN in line]
    first_hand = [i for i in starts if not _is_peer_failure(lines, i)]
    if first_hand:
        body = _block(lines, first_hand[0], lambda line: FAILURE_END in line)
    elif (root := _root_cause(lines)) is not None:
        body = f"{_who_died(root, lines)}; torchrun says:\n{root}"
    elif starts:
        body = _block(lines, starts[0], lambda line: FAILURE_END in line)
    else:
        body = "\n".join(lines[-40:])
    return f"training job failed (exit code {returncode}):\n{body}"


def _who_died(root: str, lines: list[str]) -> str:
    """A rank that failed without a traceback: killed by a signal, or exited with a code (and its last error line)."""
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    who = f"rank {rank.group(1)}" if rank else "a rank"
    code = _exit_code(root)
    if code is not None and code < 0:
        return f"{who} died without a traceback, killed by a signal (out of memory?)"
    said = next((line for line in reversed(lines) if line.startswith("error: ")), "")
    return f"{who} exited with code {'?' if code is None else code} without a traceback" + (f": {said}" if said else "")


def _block(lines: list[str], begin: int, is_end: Callable[[str], bool]) -> str:
    end = next((i for i in range(begin + 1, len(lines)) if is_end(lines[i])), len(lines) - 1)
    return "\n".join(lines[begin : end + 1])


#: torchrun's exit code for the ranks it stops itself (SIGTERM) once another has failed
STOPPED_BY_TORCHRUN = -15


def _root_cause(lines: list[str]) -> str | None:
    """torchrun's "Root Cause (first observed failure)" block, if it printed one; but when that rank is one
    torchrun stopped itself, the first of its other failures that is not. (It orders failures by timestamps of
    one second: a rank it stopped writes its error file at once and can come before a rank killed outright.)"""
    begin = next((i for i, line in enumerate(lines) if "Root Cause (first observed failure)" in line), None)
    if begin is None:
        return None
    root = _block(lines, begin, lambda line: line.startswith("====="))
    if _exit_code(root) == STOPPED_BY_TORCHRUN:
        others = (failure for failure in _other_failures(lines, begin) if _exit_code(failure) != STOPPED_BY_TORCHRUN)
        root = next(others, root)
    return root


def _other_failures(lines: list[str], root_begin: int) -> list[str]:
    """The entries ("[k]:" and its fields) of the summary's "Failures:" section, before the root cause."""
    begin = next((i for i in range(root_begin, -1, -1) if lines[i].strip() == "Failures:"), root_begin)
    starts = [i for i in range(begin, root_begin) if re.match(r"\s*\[\d+\]:\s*$", lines[i])]
    return ["\n".join(lines[a:b]).rstrip("-\n ") for a, b in zip(starts, starts[1:] + [root_begin])]


def _exit_code(failure: str) -> int | None:
    code = re.search(r"exitcode\s*:\s*(-?\d+)", failure)
    return int(code.group(1)) if code else None


def _is_peer_failure(lines: list[str], begin: int) -> bool:
    end = next((i for i in range(begin, len(lines)) if FAILURE_END in lines[i]), len(lines))
    text = "\n".join(lines[begin:end])
    return any(s in text for s in PEER_FAILURES)
