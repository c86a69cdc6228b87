"""Remove the temporary directories of builds that died (SIGKILL, OOM, power loss) beside stores.

A build writes into <parent>/.<store>.tmp-<pid>-<8 hex> only while it holds <parent>/.<store>.lock,
and an old store waits as .<store>.old-<8 hex> only under that lock too. So such a directory is
abandoned when that lock file exists and is free. It is removed only if, besides, its name has
exactly that form and it holds nothing but what a build writes: anything else is left alone.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

from storage import schema as S
from storage.hetero_arrays import PREFIX as HETERO_PREFIX
from storage.lock import try_lock
from storage.paths import lock_path

_TEMP = re.compile(r"^\.(?P<store>.+)\.(?:tmp-\d+-[0-9a-f]{8}|old-[0-9a-f]{8})$")
_BUILD_ENTRIES = {
    "zarr.json",
    S.INDPTR,
    S.INDICES,
    S.T_INDICES,
    S.WEIGHTS,
    S.IN_DEGREE,
    S.OUT_DEGREE,
    S.FEATURES,
    S.LABELS,
    S.SPLIT_PREFIX.rstrip("/"),
    S.LINK_PREFIX.rstrip("/"),
    HETERO_PREFIX.rstrip("/"),
    "spill-src.bin",
    "spill-dst.bin",
    "spill-w.bin",
}


def build_leftover(path: Path) -> Path | None:
    """The store whose build left `path` behind, or None if `path` is not such a leftover."""
    m = _TEMP.match(path.name)
    if m is None or path.is_symlink() or not path.is_dir():
        return None
    try:
        names = {p.name for p in path.iterdir()}
    except OSError:
        return None
    return path.parent / m["store"] if names <= _BUILD_ENTRIES else None


def sweep_abandoned(parent: Path, progress: Callable[[str], None], locked: Path | None = None) -> None:
    """Remove abandoned build directories in `parent`.

    locked: a store whose lock this process holds: its leftovers are abandoned without asking the
    lock (a second flock by the same process would fail).
    """
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for path in entries:
        store = build_leftover(path)
        if store is None or not lock_path(store).is_file():
            continue
        if store == locked:
            _remove(path, progress)
            continue
        with try_lock(lock_path(store)) as free:
            if free:
                _remove(path, progress)


def _remove(path: Path, progress: Callable[[str], None]) -> None:
    progress(f"removing {path}, left by a build that did not finish")
    shutil.rmtree(path, ignore_errors=True)
