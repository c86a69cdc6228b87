"""bench/plan.py plans an ``--offload all`` row as a run lays its rank out: where the column slice fits on the GPU
beside a chunk (ntp.engine.memory.offload.offloaded_layout), a run keeps it there, so the row's figures are those of
the slice on the GPU (``--offload topology``), host memory without the slice's copies included."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import plan  # noqa: E402  (bench/ is not a package)

PAPERS = {**plan.GRAPHS["papers100M"], "name": "papers100M"}


def _row(mode: dict, gpus: int, gpu_gb: int) -> dict:
    return plan.plan_row(PAPERS, "row", mode, gpus, gpu_gb * 10**9, 1, 8.4, 256)


def test_an_offload_all_row_keeps_the_slice_on_the_gpu_where_a_run_would() -> None:
    streamed = dict(nn_device="stream", offload="all")
    on_gpu = dict(nn_device="stream", offload="topology")
    for precision, gpus, gpu_gb, stays in (("bf16", 16, 16, True), ("fp32", 16, 16, False), ("bf16", 8, 16, False)):
        row = _row({**streamed, "precision": precision}, gpus, gpu_gb)
        assert row["slice_on_gpu"] is stays, (precision, gpus, row)
        kept = _row({**on_gpu, "precision": precision}, gpus, gpu_gb)
        figures = ("resident_GB", "segment_GB", "chunks", "host_GB_per_machine")
        assert ([row[k] for k in figures] == [kept[k] for k in figures]) is stays, (row, kept)
        if not stays:
            assert row["resident_GB"] < kept["resident_GB"] and row["host_GB_per_machine"] > kept["host_GB_per_machine"]
