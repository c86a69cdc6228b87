"""``--random-splits N``: N seeded random node splits with a fixed number of labelled vertices per class for training
and validation and the rest for test, the protocol of Shchur et al. ("Pitfalls of GNN evaluation", 20 and 30 a
class; PyG's ``RandomNodeSplit(num_train_per_class=...)``). A graph's own split is one draw among many; averaging
over draws is what those papers report.

- Split set k is drawn with ``numpy.random.default_rng([seed, k])``: a set does not change when N does.
- Each class's labelled vertices are shuffled; the first TRAIN go to train, the next VALID to valid, the rest of
  every class to test. A class with fewer than TRAIN + VALID labelled vertices is an error (Shchur et al. drop such
  classes; silently training on fewer would change the protocol).
- The sets are stored like the heterophilous benchmarks' (storage.schema.split_array): ``ntp train --split K``
  picks one, ``--splits all`` runs them all. They replace the source's own split.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from storage.schema import StoreError, split_array
from storage.sources.base import GraphSource


def checked_options(sets: int, text: str) -> tuple[int, int]:
    """The per-class counts of ``--split-per-class`` ("20,30" -> (20, 30)), checked with the number of sets."""
    if sets < 1:
        raise StoreError(f"--random-splits {sets}: draw at least one split. Fix: e.g. --random-splits 10")
    try:
        train, valid = (int(p) for p in text.split(","))
    except ValueError:
        raise StoreError(
            f"--split-per-class {text!r} is not two integers. Fix: pass TRAIN,VALID, e.g. --split-per-class 20,30"
        ) from None
    if train < 1 or valid < 0:
        raise StoreError(
            f"--split-per-class {text!r}: train needs at least 1 vertex a class and valid 0 or more. "
            "Fix: e.g. --split-per-class 20,30"
        )
    return train, valid


def draw_split(labels: np.ndarray, per_class: tuple[int, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One split of the labelled vertices (label >= 0): sorted ids of train, valid and test."""
    train_n, valid_n = per_class
    parts: dict[str, list[np.ndarray]] = {"train": [], "valid": [], "test": []}
    for c in np.unique(labels[labels >= 0]):
        ids = rng.permutation(np.flatnonzero(labels == c))
        if len(ids) < train_n + valid_n:
            raise StoreError(
                f"class {c} has {len(ids)} labelled vertices, fewer than the {train_n} + {valid_n} that "
                f"--split-per-class {train_n},{valid_n} draws from each class. Fix: lower --split-per-class"
            )
        parts["train"].append(ids[:train_n])
        parts["valid"].append(ids[train_n : train_n + valid_n])
        parts["test"].append(ids[train_n + valid_n :])
    return {name: np.sort(np.concatenate(p)).astype(np.int64) for name, p in parts.items()}


def with_random_splits(source: GraphSource, sets: int, per_class: tuple[int, int], seed: int) -> GraphSource:
    """``source`` whose splits are ``sets`` random draws (split set k under storage.schema.split_array)."""
    if source.task_type != "multiclass" or source.hetero is not None:
        raise StoreError(
            f"--random-splits draws class-balanced splits of a homogeneous node-classification graph; {source.name} "
            f"is {'heterogeneous' if source.hetero is not None else 'a ' + source.task_type + ' task'}. "
            "Fix: drop --random-splits"
        )

    labels_once = functools.cache(source.labels)  # the splits and the store's labels read the source once

    def splits() -> dict[str, np.ndarray]:
        labels = np.asarray(labels_once()).reshape(-1)
        drawn = {}
        for k in range(sets):
            split = draw_split(labels, per_class, np.random.default_rng([seed, k]))
            drawn |= {split_array(name, k): ids for name, ids in split.items()}
        return drawn

    info = {**source.info, "random_splits": {"sets": sets, "per_class": list(per_class), "seed": seed}}
    return dataclasses.replace(source, labels=labels_once, splits=splits, info=info)
