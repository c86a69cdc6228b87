"""``--link-split VAL,TEST``: a seeded random edge split with negatives, for any homogeneous graph (as PyG's
RandomLinkSplit): the graph becomes a link-prediction store whose message-passing graph is the training edges only.

- Undirected graphs (``--symmetrize``, or an edge list that already holds every edge both ways) are split by
  unordered pairs {u, v}: a validation or test pair never leaks into the training graph in either direction.
  The training pairs enter the topology both ways; each split stores every pair once.
- Positives are the distinct edges (duplicates merged), shuffled with ``numpy.random.default_rng(seed)``;
  ``round(VAL * E)`` go to validation and ``round(TEST * E)`` to test, the rest train.
- Validation and test get as many negatives as positives: uniform pairs u != v that are not edges of the whole
  graph (either direction when undirected), distinct, drawn from the same generator. Training negatives are sampled
  afresh during training (ntp.engine.link_batches).
The edges are held in memory while the split is made (16 bytes per edge).
"""

from __future__ import annotations

import numpy as np

from storage.schema import StoreError, is_metric
from storage.sources.base import GraphSource, all_edges


def parse_ratios(text: str) -> tuple[float, float]:
    """ "0.05,0.1" -> (0.05, 0.1); both in [0, 1) with a sum below 1, validation and test each > 0."""
    try:
        val, test = (float(p) for p in text.split(","))
    except ValueError:
        raise StoreError(
            f"--link-split {text!r} is not two fractions. Fix: pass VAL,TEST, e.g. --link-split 0.05,0.1"
        ) from None
    if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
        raise StoreError(
            f"--link-split {text!r}: validation and test fractions must be > 0 with a sum below 1. "
            "Fix: e.g. --link-split 0.05,0.1"
        )
    return val, test


def _is_symmetric(keys: np.ndarray, rev: np.ndarray) -> bool:
    return np.array_equal(np.unique(keys), np.unique(rev))


def _negatives(rng: np.random.Generator, n: int, count: int, taken: np.ndarray, undirected: bool) -> np.ndarray:
    """``count`` distinct pairs u != v, none in ``taken`` (sorted keys u * n + v)."""
    if count > n * (n - 1) // (2 if undirected else 1) - len(taken):
        raise StoreError(
            f"graph of {n} nodes is too dense to draw {count} negative pairs. Fix: use smaller --link-split fractions"
        )
    found = np.zeros(0, np.int64)
    while len(found) < count:
        u, v = rng.integers(0, n, 2 * (count - len(found)) + 16), rng.integers(0, n, 2 * (count - len(found)) + 16)
        if undirected:
            u, v = np.minimum(u, v), np.maximum(u, v)
        keys = u * n + v
        pos = np.searchsorted(taken, keys).clip(max=max(len(taken) - 1, 0))
        keep = (u != v) & ~(taken[pos] == keys if len(taken) else np.zeros(len(keys), bool))
        keys = keys[keep]
        _, first = np.unique(keys, return_index=True)
        new = keys[np.sort(first)]
        new = new[~np.isin(new, found)]
        found = np.concatenate([found, new])[:count]
    return np.stack([found // n, found % n], axis=1)


def with_link_split(
    source: GraphSource, ratios: tuple[float, float], seed: int, metric: str, symmetrize: bool
) -> GraphSource:
    """``source`` as a link-prediction source (see the module docstring)."""
    _check(source, metric)
    n = source.num_nodes
    src, dst = all_edges(source)
    undirected = symmetrize or _is_symmetric(src * n + dst, dst * n + src)
    if undirected:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
    keys = np.unique(src * n + dst)
    rng = np.random.default_rng(seed)
    pairs = {k: np.stack([v // n, v % n], axis=1) for k, v in _split_keys(keys, ratios, rng, source.name).items()}
    n_val, n_test = len(pairs["valid"]), len(pairs["test"])
    taken = keys if not undirected else np.unique(np.concatenate([keys, (keys % n) * n + keys // n]))
    neg_all = _negatives(rng, n, n_val + n_test, taken, undirected)
    splits = {
        "train": (pairs["train"], None),
        "valid": (pairs["valid"], neg_all[:n_val]),
        "test": (pairs["test"], neg_all[n_val:]),
    }
    train = pairs["train"]
    if undirected:  # both ways into the message-passing graph (a self-loop once)
        loops = train[:, 0] == train[:, 1]
        graph = np.concatenate([train, train[~loops][:, ::-1]])
    else:
        graph = train

    def edge_blocks():
        yield graph[:, 0], graph[:, 1], None

    info = {
        **source.info,
        "link_split": {
            "valid": ratios[0],
            "test": ratios[1],
            "seed": seed,
            "undirected": bool(undirected),
            "negatives_per_positive": 1,
        },
    }
    return GraphSource(
        name=source.name,
        num_nodes=n,
        feature_dim=source.feature_dim,
        edge_blocks=edge_blocks,
        feature_blocks=source.feature_blocks,
        labels=lambda: np.zeros(0),
        splits=dict,
        link_splits=lambda: splits,
        task_type="link",
        metric=metric,
        num_classes=0,
        num_tasks=1,
        ogb_name=None,
        expected_edges=len(graph),
        info=info,
    )


def _check(source: GraphSource, metric: str) -> None:
    if source.weighted:
        raise StoreError(
            f"{source.name}: --link-split of a weighted graph is not supported. Fix: drop the weight "
            "column of the edge file"
        )
    if not is_metric(metric) or metric in ("acc", "mrr"):
        raise StoreError(
            f"--link-metric {metric!r}: a random split has one negative per positive pair, which "
            "Hits@K and ROC-AUC rank. Fix: --link-metric hits@K (e.g. hits@20) or rocauc"
        )


def _split_keys(keys: np.ndarray, ratios: tuple[float, float], rng, name: str) -> dict[str, np.ndarray]:
    """The distinct edge keys shuffled into valid and test (at least one each, in ``ratios``), the rest train."""
    if len(keys) < 3:
        raise StoreError(f"{name}: {len(keys)} distinct edges cannot be split three ways. Fix: use a larger graph")
    shuffled = keys[rng.permutation(len(keys))]
    n_val = max(1, round(ratios[0] * len(keys)))
    n_test = max(1, round(ratios[1] * len(keys)))
    if n_val + n_test >= len(keys):
        raise StoreError(
            f"{name}: {len(keys)} edges leave none for training with --link-split "
            f"{ratios[0]},{ratios[1]}. Fix: smaller fractions"
        )
    return {
        "valid": shuffled[:n_val],
        "test": shuffled[n_val : n_val + n_test],
        "train": np.sort(shuffled[n_val + n_test :]),
    }
