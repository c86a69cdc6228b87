"""Ranks start with glibc asking for transparent huge pages for large blocks (ntp.run.allocator), unless the user
set GLIBC_TUNABLES: checked in real torchrun ranks, which write down the huge pages behind a 64 MiB tensor."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntp.config import TrainConfig
from ntp.run.launch import run_torchrun_job
from ntp.spec import resolve

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PROBE = """
import os, sys, torch
block = torch.ones(64 << 20, dtype=torch.uint8)  # written: every page faulted in
huge = [line for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages:")][0].split()[1]
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:  # ranks' printed lines may interleave
    f.write(huge)
"""


def _huge_kb_per_rank(monkeypatch, tmp_path: Path, tunables: str | None) -> list[int]:
    if tunables is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    out = tmp_path / f"huge-{tunables}"
    out.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    spec = resolve(TrainConfig(store="unused"), nproc=2, device="cpu", job_timeout_s=120)
    run_torchrun_job(spec, [str(probe), str(out)], on_line=lambda line: None)
    return [int(f.read_text()) for f in sorted(out.iterdir())]


@pytest.mark.skipif(
    not THP.exists() or "[madvise]" not in THP.read_text(),
    reason="the kernel gives transparent huge pages on request only in 'madvise' mode",
)
def test_ranks_ask_for_huge_pages_unless_the_user_set_the_tunables(monkeypatch, tmp_path: Path) -> None:
    ours = _huge_kb_per_rank(monkeypatch, tmp_path, None)
    assert len(ours) == 2 and all(kb >= 32 << 10 for kb in ours), ours  # most of the 64 MiB in 2 MiB pages
    theirs = _huge_kb_per_rank(monkeypatch, tmp_path, "glibc.malloc.hugetlb=0")
    assert len(theirs) == 2 and all(kb < 32 << 10 for kb in theirs), theirs
