"""bench/gpu.py's pieces that run before any job: what the GPU leases spend their minutes on must not fail there."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu  # noqa: E402


def test_the_baseline_process_imports_the_engine_and_measures_its_memory() -> None:
    """The baseline a rank's host memory is measured against: a process that imported torch and the engine (its
    code names the engine's modules in a string, which no import check sees: a module moved by the engine's
    restructuring (2026-11-27) left it importing from where the module was, which would have failed the next lease's
    first benchmark)."""
    assert gpu.baseline_pss() > 50 << 20  # torch alone is more
