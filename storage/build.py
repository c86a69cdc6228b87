"""Atomic, locked, idempotent store builds: write into a temp dir next to the target, then rename."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from storage.csr import Preprocessing
from storage.layout import Layout
from storage.lock import file_lock
from storage.paths import lock_path, temp_prefix
from storage.reader import open_store
from storage.schema import StoreError
from storage.sources.base import GraphSource
from storage.writer import write_store


def existing_store(target: Path, build_key: str, force: bool,
                   progress: Callable[[str], None]) -> Path | None:
    """The target if it is a valid store built from the same inputs and options, else None.

    Raises StoreError if a valid store with other inputs/options sits at the target (without force).
    """
    if not target.exists():
        return None
    if not _replaceable(target):
        raise StoreError(f"{target} exists and is not a graph store. Fix: choose another --out, "
                         "or remove that path yourself")
    if force:
        return None
    try:
        store = open_store(target)
    except StoreError as e:
        progress(f"existing store is not usable, rebuilding it ({e})")
        return None
    if store.meta.build_key == build_key:
        return target
    raise StoreError(f"graph store {target} already exists with other inputs or options "
                     f"(built by `{store.meta.rebuild_command}`). Fix: choose another --out, "
                     "or pass --force to replace it")


def build(make_source: Callable[[], GraphSource], target: Path, *, prep: Preprocessing,
          feature_dtype: str, build_key: str, rebuild_command: str,
          progress: Callable[[str], None], force: bool = False, layout: Layout | None = None) -> Path:
    """Build the store at `target` unless an identical one exists; safe against crashes and races."""
    found = existing_store(target, build_key, force, progress)
    if found is not None:
        progress(f"store already built: {target}")
        return found
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(target), progress):
        found = existing_store(target, build_key, force, progress)  # a racing builder may have won
        if found is not None:
            progress(f"store built by another process: {target}")
            return found
        _remove_stale_temps(target)
        tmp = target.parent / f"{temp_prefix(target)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            write_store(make_source(), tmp, prep=prep, feature_dtype=feature_dtype,
                        layout=layout or Layout(), build_key=build_key,
                        rebuild_command=rebuild_command, progress=progress)
            open_store(tmp).check_structure()
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"store ready: {target}")
    return target


def _replaceable(target: Path) -> bool:
    """Only an empty directory or something with a Zarr group's zarr.json may be replaced."""
    if not target.is_dir():
        return False
    return not any(target.iterdir()) or (target / "zarr.json").is_file()


def _remove_stale_temps(target: Path) -> None:
    """Under the lock, any temp dir of this target belongs to a dead build."""
    prefix = temp_prefix(target)
    for p in target.parent.iterdir():
        if p.name.startswith(prefix) or p.name.startswith(f".{target.name}.old-"):
            shutil.rmtree(p, ignore_errors=True)


def _publish(tmp: Path, target: Path) -> None:
    """Atomically move the finished build into place (replacing an old store if present)."""
    _fsync_dir(tmp)
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)
    _fsync_dir(target.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
