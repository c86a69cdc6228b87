"""The C heap of a CPU rank (glibc malloc): return its free pages, and keep large blocks out of it under a budget.

glibc serves a block above its mmap threshold with its own mapping, unmapped when freed. By default the threshold
rises to the size of every such block that is freed (up to 32 MiB), so a chunked epoch's temporaries soon come
from the heap, whose freed pages stay resident: a budgeted rank's resident set grew to about twice its plan
(docs/memory.md has the figures; tests/ntp/test_resident_memory.py the bound)."""

from __future__ import annotations

import ctypes

#: glibc's mallopt parameter (malloc.h): blocks at least this big get their own mapping; setting it stops it moving
_M_MMAP_THRESHOLD = -3
#: a fixed threshold of 128 KiB, glibc's own starting value: a row block of any real graph is far above it
MMAP_THRESHOLD = 128 << 10

_libc: ctypes.CDLL | None | bool = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim, _libc.mallopt  # noqa: B018 - not glibc (musl, macOS): nothing to do
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def release_free_heap() -> None:
    """Return the heap's free pages to the system (malloc_trim)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def keep_large_blocks_mapped() -> bool:
    """Fix the mmap threshold at :data:`MMAP_THRESHOLD` so that freed tensors leave the resident set at once: a
    budgeted CPU rank's resident memory then follows its live bytes (the plan). Costs a page fault per page of each
    large allocation; False where the C library is not glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
