"""The launcher owns its process tree: what it starts dies with it, and a stop leaves nothing behind.

- Children run in a session of their own (a Ctrl-C in the terminal reaches the launcher, which stops them in
  order) and get a parent-death signal (Linux ``PR_SET_PDEATHSIG``): if the launcher is killed outright (SIGKILL,
  the OOM killer), the kernel sends them SIGTERM.
- Stopping a group is SIGTERM, a grace period, then SIGKILL to every member still there, and waiting until none is.
- In the CLI, SIGTERM (what schedulers and ``kill`` send) becomes :class:`~ntp.errors.Terminated`, so the same
  cleanup runs as for Ctrl-C.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ntp.errors import Terminated, WorkerFailed, is_input_error

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def spawn_group(cmd: list[str], **popen) -> subprocess.Popen:
    """Start ``cmd`` as the leader of a new session that dies with this process."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent, **popen)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM to the whole group of ``proc``, SIGKILL to whatever is left after ``grace_s``, then wait until the
    group is empty (a worker that ignored SIGTERM, or was stopped, must not outlive the job)."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)  # also wakes members that were stopped (SIGSTOP)
    proc.wait()
    deadline = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise Terminated(f"stopped by signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_code(exc: BaseException, stopped_note: str = "") -> int:
    """The exit code of a command that ``exc`` ended, its message printed: 1 the job failed, 2 bad input (nothing
    ran), 130/143 interrupted (Ctrl-C/SIGTERM; ``stopped_note`` says what else was closed). Anything else is a bug:
    it is raised again."""
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        reason = str(exc) or "interrupted (Ctrl-C)"
        print(f"stopped: {reason}; the job's processes are gone{stopped_note}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    if isinstance(exc, WorkerFailed) or is_input_error(exc):
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, WorkerFailed) else 2
    raise exc
