"""The rank's C heap: a step's freed buffers stay for the next step instead of going back to the OS.

glibc's malloc serves an allocation at or above its mmap threshold by a mapping of its own, unmapped when freed, and
gives the top of the heap back once more than its trim threshold is free there. Both thresholds move as a process
runs (the mmap threshold up to 32 MB, the trim threshold twice it): a training step's activations, freed at its end,
then often go back to the OS and every page of them is faulted in, zeroed, again at the next step. On this project's
2-core box that was about half the runs on tolokers (1,100 page faults and 2 of a 10 ms epoch, the noise in
dropout's share) and 9 % of a 100k-vertex graph's epoch (docs/benchmarks.md, section 2). Fixing the mmap threshold at
glibc's own largest (32 MB) and the trim threshold at 128 MB keeps such buffers; larger ones are still mapped and
unmapped as before: a heap that also kept those made a 500k-vertex epoch 28 % faster for 23-60 % more peak memory,
which a memory-bound system does not trade by default."""
from __future__ import annotations

import ctypes
import functools
import os
import platform

#: mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
#: a user's own malloc settings, which stand
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.cache
def keep_freed_buffers() -> bool:
    """Set the thresholds once per process, after the data is read (its temporary buffers went back as before).
    False where nothing was set: not glibc, or the user set malloc's thresholds (environment or GLIBC_TUNABLES)."""
    if platform.libc_ver()[0] != "glibc" or user_settings():
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def user_settings() -> bool:
    return any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
