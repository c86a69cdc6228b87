"""Run the Prefect block of docs/quickstart.md the way a new user would, and check that the flow run COMPLETED.

    .venv/bin/python docs/quickstart.py              # a free port, a temporary home; exit 0 when the run completed
    .venv/bin/python docs/quickstart.py --port 4200  # the block's own port (fails if a server already uses it)
    .venv/bin/python docs/quickstart.py --keep DIR   # keep the Prefect home, data, MLflow database and logs in DIR

The commands are read from docs/quickstart.md (the first ```bash block of its section "3. The Prefect loop"), not
copied here, so the page cannot drift from what is tested. Every command runs in a fresh
`bash -c` shell, as in a new terminal: only what the block's per-terminal line (`. .venv/bin/activate`) and the
Prefect profile (`prefect config set ...`) provide carries over from one command to the next. The short commands
run on a pseudo-terminal with nothing typed, so a command that stops to ask a question (as `prefect deploy` does
for a deployment without `schedules:`) times out and fails instead of passing silently. `prefect server start` and
`prefect worker start` are left running in the background, as in their own terminals, and are stopped at the end
with every process they started.

What differs from a user's machine, so that nothing leaks into (or depends on) the user's own setup: the port (a
free one, unless --port; every `4200` of the block is replaced), and the environment: every PREFECT_*, MLFLOW_* and
NTP_* variable of the caller is dropped, and the shells get a private PREFECT_HOME (where `prefect config set`
writes the profile), NTP_DATA_DIR, NTP_CACHE_DIR and MLFLOW_TRACKING_URI (sqlite) in a temporary directory.

`docs/screenshots.py` and `tests/pipeline/test_readme_prefect.py` use :func:`readme_session`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
README = PROJECT / "docs" / "quickstart.md"  #: the page whose Prefect block is run (the README linked to it)
SECTION = "## 3. The Prefect loop"
README_PORT = "4200"
LONG_RUNNING = re.compile(r"\bprefect\s+(server|worker)\s+start\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
FLOW_RUN_UUID = re.compile(r"UUID:\s*([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


@dataclasses.dataclass(frozen=True)
class Step:
    command: str
    background: bool  # a server or a worker: left running, as in its own terminal


def readme_block(text: str) -> list[str]:
    """The lines of the first ```bash block after the Prefect section's heading."""
    start = text.index(SECTION)
    match = re.compile(r"^```bash\n(.*?)^```", re.S | re.M).search(text, start)
    if match is None:
        raise ValueError(f"no ```bash block after {SECTION!r} in {README.name}")
    return match.group(1).splitlines()


def parse_block(lines: list[str]) -> tuple[list[str], list[Step]]:
    """(the per-terminal prelude, the steps): comment lines and blank lines are skipped, `\\` continues a line, a
    line that sources a file (`. FILE`, `source FILE`) is run at the start of every later shell."""
    prelude: list[str] = []
    steps: list[Step] = []
    joined: list[str] = []
    pending = ""
    for raw in lines:
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    for line in (x.strip() for x in joined):
        if not line or line.startswith("#"):
            continue
        if re.match(r"(\.|source)\s", line):
            prelude.append(line)
        else:
            steps.append(Step(line, bool(LONG_RUNNING.search(line))))
    return prelude, steps


def readme_steps(port: int | str = README_PORT) -> tuple[list[str], list[Step]]:
    prelude, steps = parse_block(readme_block(README.read_text()))
    port = str(port)
    return prelude, [dataclasses.replace(s, command=s.command.replace(README_PORT, port)) for s in steps]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "NTP_"))}
    env.update(
        {
            "PREFECT_HOME": str(root / "prefect-home"),
            "NTP_DATA_DIR": str(root / "data"),
            "NTP_CACHE_DIR": str(root / "cache"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'data' / 'mlflow.db'}",
        }
    )
    return env


def run_in_terminal(script: str, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``bash -c script`` in the project root on a fresh pseudo-terminal (120 columns) and type nothing.
    Returns (exit status, output without colours); a command still running after ``timeout`` (e.g. waiting for an
    answer) is killed with its process group and reported as 124."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=PROJECT,
        env={**env, "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        close_fds=True,
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every process holding the terminal has exited
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        if timed_out or proc.poll() is None:
            stop_group(proc)
        os.close(master)
    rc = proc.wait()
    return (124 if timed_out else rc), ANSI.sub("", out.decode(errors="replace"))


def stop_group(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group and every descendant (some leave the group), then SIGKILL what is left."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for p in family:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(family, timeout=timeout)
        if not alive and proc.poll() is not None:
            break
    proc.wait(timeout=timeout)


def get_json(url: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@dataclasses.dataclass
class Session:
    """A running session of the Prefect block: the server and the worker are up until the ``with`` block ends."""

    root: Path
    port: int
    env: dict[str, str]
    prelude: list[str]
    log: Callable[[str], None]
    background: list[tuple[Step, subprocess.Popen, Path]] = dataclasses.field(default_factory=list)
    outputs: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
    flow_run_ids: list[str] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    @property
    def mlflow_uri(self) -> str:
        return self.env["MLFLOW_TRACKING_URI"]

    def shell(self, command: str) -> str:
        return " && ".join([*self.prelude, command])

    def run(self, command: str, timeout: float = 180) -> str:
        """One command in a new terminal; fails (RuntimeError with its output) unless it exits 0."""
        self.log(f"$ {command}")
        start = time.monotonic()
        rc, out = run_in_terminal(self.shell(command), self.env, timeout)
        self.outputs.append((command, rc, out))
        tail = "\n".join(out.strip().splitlines()[-15:])
        self.log(f"  exit {rc} after {time.monotonic() - start:.0f} s\n  " + tail.replace("\n", "\n  "))
        if rc != 0:
            why = "still running (waiting for input?)" if rc == 124 else f"exit status {rc}"
            raise RuntimeError(f"`{command}`: {why} after {time.monotonic() - start:.0f} s:\n{out[-6000:]}")
        self.flow_run_ids += FLOW_RUN_UUID.findall(out) if "deployment run" in command else []
        return out

    def start(self, step: Step) -> subprocess.Popen:
        """A long-running command in its own terminal (a process group), its output in a log file."""
        self.log(f"$ {step.command}      (left running)")
        log = self.root / f"{'server' if ' server ' in step.command else 'worker'}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self.shell(step.command)],
                cwd=PROJECT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((step, proc, log))
        if " server " in step.command:
            self.wait_healthy(proc, log)
        return proc

    def wait_healthy(self, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if server.poll() is not None:
                raise RuntimeError(f"the Prefect server exited:\n{log.read_text()[-4000:]}")
            try:
                if get_json(f"{self.api}/health") is True:
                    self.log(f"  server healthy after {time.monotonic() - start:.0f} s: {self.url}")
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Prefect server is not healthy after {timeout} s:\n{log.read_text()[-4000:]}")

    def flow_run(self, flow_run_id: str | None = None) -> dict:
        """The flow run (the last one `prefect deployment run` created, by default) as the API returns it."""
        flow_run_id = flow_run_id or self.flow_run_ids[-1]
        return get_json(f"{self.api}/flow_runs/{flow_run_id}")  # type: ignore[return-value]

    def stop(self) -> None:
        for step, proc, _log in reversed(self.background):
            stop_group(proc)
            self.log(f"  stopped `{step.command}`")
        self.background.clear()


@contextmanager
def readme_session(
    port: int | None = None, root: Path | None = None, log: Callable[[str], None] = print, run_timeout: float = 600
) -> Iterator[Session]:
    """Run every command of the Prefect block; yield while the server and the worker still run (more
    commands: ``session.run``); then stop them and remove the temporary directory (not a given ``root``)."""
    own_root = root is None
    root = Path(tempfile.mkdtemp(prefix="ntp-quickstart-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    prelude, steps = readme_steps(port)
    session = Session(root=root, port=port, env=private_env(root), prelude=prelude, log=log)
    try:
        for step in steps:
            if step.background:
                session.start(step)
            else:
                session.run(step.command, timeout=run_timeout if "--watch" in step.command else 180)
        yield session
    finally:
        session.stop()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, help="the Prefect server's port (default: a free one)")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR and keep it (default: a temporary directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        with readme_session(port=args.port, root=args.keep) as session:
            if not session.flow_run_ids:
                print("the Prefect block triggers no `prefect deployment run`", file=sys.stderr)
                return 1
            run = session.flow_run()
            print(f"flow run {run['name']} ({run['id']}): {run['state_type']}")
            ok = run["state_type"] == "COMPLETED"
    except RuntimeError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"{'OK' if ok else 'FAILED'} after {time.monotonic() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
