"""Atomic, locked, idempotent store builds: write into a temp dir next to the target, then rename.

Nothing but a graph store (recognised by its metadata) is ever replaced: an unrelated directory or
Zarr group at the target is refused, with or without force.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from storage.csr import Preprocessing
from storage.layout import Layout
from storage.lock import file_lock
from storage.paths import lock_path, temp_prefix
from storage.reader import is_graph_store, open_store
from storage.resources import check_fits
from storage.schema import StoreError
from storage.sources.base import GraphSource
from storage.sweep import sweep_abandoned
from storage.writer import write_store


def existing_store(target: Path, build_key: str, force: bool, progress: Callable[[str], None]) -> Path | None:
    """The target if it is a valid store built from the same inputs and options, else None.

    Raises StoreError if the target is not one of our stores (with or without force), or is a valid
    store with other inputs/options (without force).
    """
    if not target.exists() and not target.is_symlink():
        return None
    if not _replaceable(target):
        raise StoreError(
            f"{target} exists and is not a graph store (no graph-store metadata in its "
            "zarr.json); it is never replaced, not even with --force. Fix: choose another "
            "--out, or remove that path yourself"
        )
    if force:
        return None
    try:
        store = open_store(target)
    except StoreError as e:
        progress(f"existing store is not usable, rebuilding it ({e})")
        return None
    if store.meta.build_key == build_key:
        return target
    raise StoreError(
        f"graph store {target} already exists with other inputs or options "
        f"(built by `{store.meta.rebuild_command}`). Fix: choose another --out, "
        "or pass --force to replace it"
    )


def build(
    make_source: Callable[[], GraphSource],
    target: Path,
    *,
    prep: Preprocessing,
    feature_dtype: str,
    build_key: str,
    rebuild_command: str,
    progress: Callable[[str], None],
    force: bool = False,
    layout: Layout | None = None,
) -> Path:
    """Build the store at `target` unless an identical one exists; safe against crashes and races."""
    try:
        return _build(
            make_source,
            target,
            prep=prep,
            feature_dtype=feature_dtype,
            build_key=build_key,
            rebuild_command=rebuild_command,
            progress=progress,
            force=force,
            layout=layout,
        )
    except OSError as e:  # inputs raise their own StoreError: this is the target's side
        raise _os_problem(e, target) from None


def _build(
    make_source: Callable[[], GraphSource],
    target: Path,
    *,
    prep: Preprocessing,
    feature_dtype: str,
    build_key: str,
    rebuild_command: str,
    progress: Callable[[str], None],
    force: bool,
    layout: Layout | None,
) -> Path:
    if target.parent.is_dir():
        sweep_abandoned(target.parent, progress)
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
        sweep_abandoned(target.parent, progress, locked=target)
        source = make_source()
        check_fits(source, prep, feature_dtype, target.parent)
        tmp = target.parent / f"{temp_prefix(target)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            write_store(
                source,
                tmp,
                prep=prep,
                feature_dtype=feature_dtype,
                layout=layout or Layout(),
                build_key=build_key,
                rebuild_command=rebuild_command,
                progress=progress,
            )
            open_store(tmp).check_structure()
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"store ready: {target}")
    return target


def _replaceable(target: Path) -> bool:
    """Only an empty directory or one of our stores may be replaced."""
    if not target.is_dir():  # a file, or a dangling symlink
        return False
    return not any(target.iterdir()) or is_graph_store(target)


def _publish(tmp: Path, target: Path) -> None:
    """Atomically move the finished build into place (replacing an old store if present)."""
    _fsync_dir(tmp)
    if target.exists() and any(target.iterdir()):
        if not is_graph_store(target):  # checked again: it may have changed while we built
            raise StoreError(
                f"{target} changed while the store was built and is no longer a graph "
                "store; it was left alone. Fix: choose another --out"
            )
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)  # replaces an empty directory; fails (ENOTEMPTY) if one appeared
    _fsync_dir(target.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_problem(e: OSError, target: Path) -> StoreError:
    """An OS error while creating or writing the store, with the fix for its cause."""
    where = e.filename or target
    if e.errno == errno.ENOSPC:
        fix = f"free disk space under {target.parent}, or choose another --out/--data-dir"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"check the permissions of {target.parent} (it must be writable), or choose another --out"
    else:
        fix = f"check that {target.parent} is a writable directory, or choose another --out"
    return StoreError(f"cannot build the graph store {target}: {where}: {e.strerror or e}. Fix: {fix}")
