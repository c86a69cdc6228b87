"""A rank's freed buffers stay in its heap for the next step (ntp.engine.heap): a fresh process repeats a step that
mallocs four buffers of 28 MB (the size of a 100k-vertex graph's activations), writes them and frees them, and counts
the pages faulted in over its last five steps. Nothing else allocates between them, so what glibc does is the same in
every run: with its own thresholds it gives the 112 MB back at the end of every step (the first step's mappings raise
its thresholds to 28 and 56 MB)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")

SIZE = 28 << 20
STEPS = f"""
import ctypes, resource, sys
from ntp.engine import heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
print(heap.keep_freed_buffers() if sys.argv[1] == "keep" else None)
def step():
    buffers = [libc.malloc({SIZE}) for _ in range(4)]
    for b in buffers:
        libc.memset(b, 1, {SIZE})
    for b in buffers:
        libc.free(b)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", STEPS, mode], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    return out[0], int(out[1])


def test_a_steps_freed_buffers_are_not_faulted_in_again() -> None:
    kept, faults = _run("keep")
    _, default_faults = _run("default")
    pages = 5 * 4 * SIZE // 4096
    assert kept == "True"
    assert default_faults > pages / 2, "with glibc's own thresholds the buffers went back (the case this module is for)"
    assert faults < pages / 50, f"{faults} page faults in 5 steps: the buffers went back to the OS"


def test_a_users_own_malloc_settings_stand() -> None:
    assert _run("keep", MALLOC_TRIM_THRESHOLD_="65536")[0] == "False"
    assert _run("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=65536")[0] == "False"
