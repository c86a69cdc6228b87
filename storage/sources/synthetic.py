"""A deterministic, seeded power-law graph with planted classes, for tests and benchmarks.

Vertices have a hidden rank r; endpoints are drawn with P(rank <= k) = sqrt(k / n), so in- and
out-degrees follow a power law (exponent about 3). Vertex id = (r * a + b) mod n scatters hubs
over the id space. Class(r) = r mod classes. With probability `homophily` an edge's destination
is moved to a neighbouring rank of the source's class, so neighbours tend to share labels.
Features are class means plus unit Gaussian noise (means scaled so classes overlap: a model
that also uses the graph beats one that does not). Everything is generated in blocks from
per-block seeds: the same arguments give the same bytes, in bounded memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from storage.sources.base import EdgeBlock, GraphSource

EDGE_BLOCK = 1 << 21
ROW_BLOCK = 1 << 16
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the generator (all recorded in the store's metadata)."""

    nodes: int = 10_000
    avg_degree: float = 10.0
    features: int = 32
    classes: int = 8
    seed: int = 0
    homophily: float = 0.8
    signal: float = 1.5

    def __post_init__(self) -> None:
        if not 1 <= self.nodes < 3 * 10**9:
            raise ValueError(f"nodes must be in [1, 3e9), got {self.nodes}")
        if self.avg_degree < 0:
            raise ValueError(f"avg_degree must be >= 0, got {self.avg_degree}")
        if self.features < 1 or self.classes < 1:
            raise ValueError("features and classes must be >= 1")
        if self.classes > self.nodes:
            raise ValueError(f"classes ({self.classes}) cannot exceed nodes ({self.nodes})")
        if not 0 <= self.homophily <= 1:
            raise ValueError(f"homophily must be in [0, 1], got {self.homophily}")

    @property
    def num_edges(self) -> int:
        return int(round(self.nodes * self.avg_degree))


class _Ranks:
    """The bijection between ranks and vertex ids."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng([seed, 0])
        a = int(rng.integers(1, max(n, 2)))
        while math.gcd(a, n) != 1:
            a += 1
        self.n, self.a, self.b = n, a % n if n > 1 else 0, int(rng.integers(0, n))
        self.a_inv = pow(self.a, -1, n) if n > 1 else 0

    def to_id(self, rank: np.ndarray) -> np.ndarray:
        return (rank * self.a + self.b) % self.n

    def to_rank(self, ids: np.ndarray) -> np.ndarray:
        return ((ids - self.b) % self.n) * self.a_inv % self.n


def _power_law_ranks(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    u = rng.random(size)
    return np.minimum((n * u * u).astype(np.int64), n - 1)


def synthetic_source(spec: SyntheticSpec) -> GraphSource:
    """A GraphSource generating `spec`'s graph on demand."""
    n, c = spec.nodes, spec.classes
    ranks = _Ranks(n, spec.seed)

    def edge_blocks() -> Iterator[EdgeBlock]:
        total = spec.num_edges
        for i, start in enumerate(range(0, total, EDGE_BLOCK)):
            size = min(EDGE_BLOCK, total - start)
            rng = np.random.default_rng([spec.seed, 1, i])
            src = _power_law_ranks(rng, size, n)
            dst = _power_law_ranks(rng, size, n)
            same = rng.random(size) < spec.homophily
            moved = dst[same] - dst[same] % c + src[same] % c
            moved[moved >= n] -= c
            dst[same] = moved
            yield ranks.to_id(src), ranks.to_id(dst), None

    def labels() -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, ROW_BLOCK):
            ids = np.arange(start, min(n, start + ROW_BLOCK), dtype=np.int64)
            out[start : start + len(ids)] = ranks.to_rank(ids) % c
        return out

    def feature_blocks() -> Iterator[np.ndarray]:
        f = spec.features
        means = np.random.default_rng([spec.seed, 2]).standard_normal((c, f), dtype=np.float32) * np.float32(
            spec.signal / math.sqrt(f)
        )
        for i, start in enumerate(range(0, n, ROW_BLOCK)):
            ids = np.arange(start, min(n, start + ROW_BLOCK), dtype=np.int64)
            rng = np.random.default_rng([spec.seed, 3, i])
            yield means[ranks.to_rank(ids) % c] + rng.standard_normal((len(ids), f), dtype=np.float32)

    def splits() -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {"train": [], "valid": [], "test": []}
        cut1, cut2 = SPLIT_FRACTIONS[0], SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]
        for i, start in enumerate(range(0, n, ROW_BLOCK)):
            u = np.random.default_rng([spec.seed, 4, i]).random(min(ROW_BLOCK, n - start))
            ids = np.arange(start, start + len(u), dtype=np.int64)
            parts["train"].append(ids[u < cut1])
            parts["valid"].append(ids[(u >= cut1) & (u < cut2)])
            parts["test"].append(ids[u >= cut2])
        return {k: np.concatenate(v) for k, v in parts.items()}

    return GraphSource(
        name="synthetic",
        num_nodes=n,
        feature_dim=spec.features,
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=labels,
        splits=splits,
        num_classes=c,
        expected_edges=spec.num_edges,
        info={"kind": "synthetic", **asdict(spec)},
    )
