"""The host allocator setting every rank starts with.

An epoch allocates the same activations, dropout masks and gradients again and again, most far above glibc's mmap
threshold (32 MiB at most), so glibc maps each one fresh and unmaps it at free, and the next epoch takes a page
fault per 4 KiB page, each zeroed by the kernel again. On a CPU rank that was a quarter to two fifths of a
coupled GCN epoch (docs/benchmarks.md, section 2). With glibc's ``hugetlb`` tunable the mapped blocks ask for
transparent huge pages: one fault per 2 MiB and no extra memory (freed blocks still go back to the system, unlike
with the "keep every freed block" settings torch's CPU launcher gets from jemalloc or tcmalloc, which raised the
peak by half here).

Tunables are read when a process starts: torchrun's workers get this environment; a ``--mode single`` run keeps
the allocator its own process was started with (start it with the variable below to get the same).
"""

from __future__ import annotations

import os

#: glibc's tunables: mmapped blocks madvise(MADV_HUGEPAGE) (where the kernel offers transparent huge pages)
TUNABLES = "glibc.malloc.hugetlb=1"


def allocator_env() -> dict[str, str]:
    """What the ranks' environment adds: the tunables above, unless the user set GLIBC_TUNABLES (theirs stand)."""
    return {} if "GLIBC_TUNABLES" in os.environ else {"GLIBC_TUNABLES": TUNABLES}
