"""Up-front disk and memory check of a build, from the graph's sizes alone (before any edge is read).

Store bytes: indptr and degrees (8 bytes x 3n), indices (4 or 8 bytes per edge), weights (4 per
edge), features (n x F x 2 or 4), labels (8n or 4nT), splits (at most 8n). The edge spill between
the CSR passes holds (2 x index + weight) bytes per raw edge and is gone before the arrays are
written, so the disk peak is the larger of the two. Memory peaks while the CSR is sorted: the
indices (and weights) of every edge plus about four int64 arrays over the vertices, plus blocks.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from storage import schema as S
from storage.csr import Preprocessing
from storage.schema import StoreError
from storage.sources.base import GraphSource

SKIP_ENV = "NTP_SKIP_RESOURCE_CHECK"  # "1": build even when the estimate says it will not fit
BLOCK_MEMORY = 512 << 20  # edge blocks, sort keys and the Python process itself
PADDING = 24 << 20
GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    disk_bytes: int
    memory_bytes: int


def estimate(source: GraphSource, prep: Preprocessing, feature_dtype: str) -> Estimate:
    """Disk and peak memory of building `source` (edges unknown up front count as none)."""
    n, p = source.num_nodes, prep.effective()
    raw = source.expected_edges or 0
    index = 4 if S.index_dtype_for(n) == "int32" else 8
    weight = 4 if source.weighted else 0
    edges = raw * (2 if p.symmetrize else 1) + (n if p.self_loops else 0)
    feature = 4 if feature_dtype == "float32" else 2
    labels = 8 * n if source.task_type == "multiclass" else 4 * n * source.num_tasks
    store = 24 * n + (index + weight) * edges + n * source.feature_dim * feature + labels + 8 * n
    spill = (2 * index + weight) * raw
    memory = (index + weight) * edges + 32 * n + BLOCK_MEMORY
    return Estimate(disk_bytes=max(store + PADDING, spill), memory_bytes=memory)


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, lowered by a cgroup limit; None if unknown."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            pass
    found += _cgroup_room()
    return min(found) if found else None


def _cgroup_room() -> list[int]:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        return [] if limit == "max" else [max(int(limit) - used, 0)]
    except (OSError, ValueError):
        return []


#: Share of available memory a build may plan to use: the estimate models the peak, not the allocator's slack.
MEMORY_MARGIN = 0.9


def check_fits(source: GraphSource, prep: Preprocessing, feature_dtype: str, where: Path) -> Estimate:
    """Raise StoreError with the numbers and the fix if the build cannot fit in `where` or in memory."""
    est = estimate(source, prep, feature_dtype)
    if os.environ.get(SKIP_ENV) == "1":
        return est
    what = (
        f"{source.name} ({source.num_nodes:,} nodes, {source.expected_edges or 0:,} edges, "
        f"{source.feature_dim} features)"
    )
    fix = (
        f"make the graph smaller (--nodes, --avg-degree, --features), or build on a machine with more "
        f"room; set {SKIP_ENV}=1 to build anyway"
    )
    free_disk = shutil.disk_usage(where).free
    if est.disk_bytes > free_disk:
        raise StoreError(
            f"{what} needs about {est.disk_bytes / GIB:,.1f} GiB of disk but {where} has "
            f"{free_disk / GIB:,.1f} GiB free. Fix: choose another --out/--data-dir on a larger "
            f"disk, free space, or {fix}"
        )
    memory = available_memory()
    if memory is not None and est.memory_bytes > memory * MEMORY_MARGIN:
        raise StoreError(
            f"{what} needs about {est.memory_bytes / GIB:,.1f} GiB of memory to build but "
            f"{memory / GIB:,.1f} GiB is available. Fix: {fix}"
        )
    return est
