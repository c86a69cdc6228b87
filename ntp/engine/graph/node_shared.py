"""One copy per machine: the ranks of a node share large read-only arrays (the topology) through mapped files.

Local rank 0 builds the arrays straight into files of a node-local folder (tmpfs ``/dev/shm`` where it has room,
else the temp folder: the page cache still holds one copy); after a barrier the other local ranks map the same
files, read-only (a stray write fails at once; and a read-only page lock of a shared mapping, as ``--offload``
takes of the topology on a GPU, keeps the one copy, where Linux gives each rank a private copy of a copy-on-write
mapping's pages it locks); after a second barrier local rank 0 removes the folder. The mappings keep the memory
until the last rank lets go, so nothing is left on disk, even when a rank fails later.
``NTP_SHARED_DIR`` chooses the folder. Measure what the node holds with PSS, not RSS (RSS counts shared pages once
per process).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ntp.engine.distributed.collectives import barrier
from ntp.engine.graph.topology import Allocator, Builder, empty

#: Room kept free in the shared folder beyond what the arrays need.
HEADROOM = 1.2
MANIFEST = "arrays.json"


def shared_dir(required_bytes: int) -> Path:
    """Where local rank 0 puts the shared arrays: ``NTP_SHARED_DIR``, else ``/dev/shm`` when it has room, else the
    temp folder."""
    if os.environ.get("NTP_SHARED_DIR"):
        return Path(os.environ["NTP_SHARED_DIR"])
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize >= required_bytes * HEADROOM:
            return shm
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def job_key(*parts: object) -> str:
    """A name that the ranks of one node derive alike and that differs between jobs (and restarts) on the node."""
    env = [
        os.environ.get(k, "")
        for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK")
    ]
    return hashlib.blake2b(repr((env, parts)).encode(), digest_size=8).hexdigest()


def on_node(
    build: Builder, *, local_rank: int, local_world: int, key: str, required_bytes: int
) -> dict[str, np.ndarray]:
    """``build(alloc)`` once per node, its arrays shared by the node's ranks. Every rank of the job must call this
    at the same point (it holds two barriers); a single local rank builds in its own memory."""
    if local_world == 1:
        return build(empty)
    folder = shared_dir(required_bytes) / f"ntp-shared-{key}"
    if local_rank == 0:
        try:
            shutil.rmtree(folder, ignore_errors=True)  # left by a killed run of the same job (same key and port)
            folder.mkdir(parents=True)
            arrays = build(_file_allocator(folder))
            kept = {name: [list(a.shape), a.dtype.str] for name, a in arrays.items()}
            (folder / MANIFEST).write_text(json.dumps(kept))
            barrier()  # built
            barrier()  # mapped by every local rank
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return arrays
    barrier()
    arrays = {
        name: _map(folder / f"{name}.npy", tuple(shape), np.dtype(dtype))
        for name, (shape, dtype) in json.loads((folder / MANIFEST).read_text()).items()
    }
    barrier()
    return arrays


def _file_allocator(folder: Path) -> Allocator:
    def alloc(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if not np.prod(shape):  # an empty file cannot be mapped
            return np.empty(shape, dtype)
        return np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)

    return alloc


def _map(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if not np.prod(shape):
        return np.empty(shape, dtype)
    return np.load(path, mmap_mode="r")
