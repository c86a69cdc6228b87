"""Finding the processes a test started, by a marker in their command line or environment (a unique temporary
path)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_with(marker: str, where: str = "cmdline") -> list[int]:
    """Pids of live processes whose command line (or, with ``where="environ"``, environment) contains ``marker``
    (zombies excluded)."""
    pids = []
    for cmdline in Path("/proc").glob(f"[0-9]*/{where}"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and int(cmdline.parent.name) != os.getpid():
                    pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
