"""Exclusive inter-process file locks (fcntl.flock) held while a store is built."""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def file_lock(path: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if needed); the OS drops it if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(f"waiting for another build holding {path}")
            start = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            if on_wait is not None:
                on_wait(f"lock acquired after {time.monotonic() - start:.1f}s")
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def try_lock(path: Path) -> Iterator[bool]:
    """Hold an existing lock file's flock if it is free right now; yields whether it was.

    Never creates the file, never waits. A free lock proves no live process is building under it.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
