"""Helpers shared by the storage tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from storage.layout import Layout

REPO = Path(__file__).resolve().parents[2]

# Small chunks so that even small test graphs span many chunk files.
SMALL_CHUNKS = Layout(row_chunk=256, edge_chunk=1024, feature_row_chunk=128, feature_col_chunk=8)


def quiet(line: str) -> None:
    """Progress sink for tests."""


def writable_copy(src: Path, dest: Path) -> Path:
    """A private, writable copy of a (read-only) shared dataset folder."""
    shutil.copytree(src, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dest
