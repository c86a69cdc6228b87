"""bench/time_to_accuracy.py's measure: the time each curve first reaches a share of the best accuracy any reached."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import time_to_accuracy as tta  # noqa: E402  (bench/ is not a package)


def test_time_to_reach_a_share_of_the_best_validation_accuracy() -> None:
    curves = {
        "full": [(1.0, 0.50), (2.0, 0.79), (3.0, 0.80), (4.0, 0.70)],  # the better best: 0.80
        "sampled": [(0.5, 0.60), (1.5, 0.785), (2.5, 0.78)],
        "never": [(0.1, 0.70)],
    }
    target, reached = tta.time_to_target(curves, 0.98)
    assert target == pytest.approx(0.784)
    assert reached == {"full": 2.0, "sampled": 1.5, "never": None}  # the first crossing, not the best point
    _, exact = tta.time_to_target({"a": [(2.0, 0.5), (1.0, 0.5)]}, 1.0)
    assert exact == {"a": 1.0}  # reaching the target exactly counts; points are taken in time order
    target, none = tta.time_to_target({"empty": []}, 0.98)
    assert math.isnan(target) and none == {"empty": None}
    rows = tta.summarise("g", {k: {"curve": v, "test_at": {t: a - 0.1 for t, a in v}} for k, v in curves.items()}, 0.98)
    full = next(r for r in rows if r["system"] == "full")
    assert full["best_valid"] == 0.80 and full["test_at_best_valid"] == pytest.approx(0.70)
    assert full["time_to_target_s"] == 2.0 and full["train_s"] == 4.0
