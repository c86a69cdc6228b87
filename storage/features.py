"""Feature transforms applied while a store is written (its build key records them)."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from storage.sources.base import GraphSource


def l1_rows(block: np.ndarray) -> np.ndarray:
    """Each row divided by the sum of its absolute values; an all-zero row stays zero.

    For non-negative bag-of-words features this is Kipf & Welling's row normalisation (PyG's NormalizeFeatures).
    """
    block = np.asarray(block, dtype=np.float32)
    norms = np.abs(block).sum(axis=1, keepdims=True, dtype=np.float64)
    return (block / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def with_normalized_features(source: GraphSource) -> GraphSource:
    """`source` whose feature rows are L1-normalised (`ntp data prepare --normalize-features`)."""
    blocks = source.feature_blocks

    def normalized() -> Iterator[np.ndarray]:
        return (l1_rows(block) for block in blocks())

    return dataclasses.replace(source, feature_blocks=normalized)
