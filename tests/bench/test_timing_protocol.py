"""bench/common.py:alternating_turns, the one protocol of bench/epoch.py: the same warm-up, turns and statistic for
every system, in an order that rotates from turn to turn."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import alternating_turns  # noqa: E402  (bench/ is not a package)


def test_every_system_gets_the_same_warmup_and_turns_in_rotating_order() -> None:
    calls: list[tuple[str, int]] = []
    epochs = {"a": iter([9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), "b": iter([9.0, 10, 20, 30, 40, 50, 60])}

    def system(name: str):
        def turn(k: int) -> list[float]:
            calls.append((name, k))
            return [float(next(epochs[name])) for _ in range(k)]

        return turn

    result = alternating_turns({"a": system("a"), "b": system("b")}, warmup=1, turns=3, per_turn=2, settle=0)
    assert calls == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("b", 2), ("a", 2), ("a", 2), ("b", 2)]
    # the warm-up epoch (9) is not timed; per turn the median of its epochs, then the median over turns
    assert result == {"a": 3.5, "b": 35.0}
