"""Progress reporting: a callable taking one line of text."""

from __future__ import annotations

import sys
import time
from typing import Callable

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    """Default progress sink: timestamped lines on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def silent(line: str) -> None:
    """A progress sink that drops everything."""
