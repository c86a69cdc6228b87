"""bench/profile_epoch.py's reading of a profiled epoch's copies, on a trace laid out as torch's profiler (Kineto)
writes it: each copy an event named by its direction, its bytes among its args."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import profile_epoch  # noqa: E402


def _copy(direction: str, nbytes: int, us: float) -> dict:
    kinds = {"HtoD": "Pinned -> Device", "DtoH": "Device -> Pinned"}
    return {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": f"Memcpy {direction} ({kinds[direction]})",
        "dur": us,
        "args": {"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / us / 1e3},
    }


def test_the_bytes_an_epoch_copied_each_way_and_their_rates() -> None:
    trace = {
        "traceEvents": [
            _copy("HtoD", 3 * 10**9, 100_000.0),
            _copy("HtoD", 1 * 10**9, 60_000.0),
            _copy("DtoH", 2 * 10**9, 80_000.0),
            {"ph": "X", "cat": "kernel", "name": "void cusparse::csrmm_kernel", "dur": 5_000.0, "args": {}},
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy DtoD (Device -> Device)",
                "dur": 10.0,
                "args": {"bytes": 10**9},
            },
        ]
    }
    line = profile_epoch.copied(trace, epochs=2)
    assert line == "copied an epoch: up 2.000 GB (25.0 GB/s), down 1.000 GB (25.0 GB/s)", line
    assert profile_epoch.copied({"traceEvents": []}, 1) == "copied an epoch: up 0.000 GB (-), down 0.000 GB (-)"
