"""Edge splits of link prediction: the checks every source's splits pass, and OGB's split files read safely.

OGB ships each split as ``split/<name>/{train,valid,test}.pt``: a torch pickle of a dict of numpy arrays. Such a file
is only ever read with ``torch.load(weights_only=True)`` and an explicit allow-list of the numpy globals that
rebuild an array (:func:`load_split_file`); anything else it refers to is refused. ``.npz`` copies are read with
``allow_pickle=False``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np

from storage.schema import StoreError

LINK_SPLITS = ("train", "valid", "test")
#: Keys of OGB's link split dicts: pairs ("edge", "edge_neg") or a source with targets ("source_node", ...).
KNOWN_KEYS = ("edge", "edge_neg", "weight", "year", "source_node", "target_node", "target_node_neg")
NPZ_FIX = (
    "use the split files of OGB's official download, or save the split as .npz next to it "
    "(np.savez(FILE, edge=..., edge_neg=...), int64 [E, 2])"
)

LinkSplit = tuple[np.ndarray, "np.ndarray | None"]


def _numpy_allow_list() -> list:
    """The globals a pickled numpy array needs, under numpy 1's and numpy 2's module names."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    dtypes = {
        type(np.dtype(t))
        for t in (
            "bool",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "float16",
            "float32",
            "float64",
        )
    }
    return [
        _reconstruct,
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        *dtypes,
    ]


def _refusal(message: str) -> str:
    """What torch's refusal says the file needs (not its advice to allow it or to load without weights_only)."""
    found = re.search(r"GLOBAL (\S+)", message)
    if found:
        return f"it refers to {found.group(1)}, which is not allowed"
    return " ".join(message.split())[:200]


def load_split_file(path: Path) -> dict[str, np.ndarray]:
    """A split file (.pt or .npz) as {key: numpy array}; anything but a dict of arrays is a StoreError."""
    path = Path(path)
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise StoreError(f"split file {path} cannot be read as .npz ({e}). Fix: {NPZ_FIX}") from None
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_allow_list()):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError, OSError, ValueError) as e:
        reason = _refusal(str(e))
        raise StoreError(
            f"split file {path} is not an allowed split file: it is loaded only with "
            f"torch.load(weights_only=True) and numpy's array globals; {reason}. "
            f"Fix: {NPZ_FIX}"
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise StoreError(
            f"split file {path} holds a {type(obj).__name__}, not a dict of arrays keyed by name. Fix: {NPZ_FIX}"
        )
    out = {}
    for key, value in obj.items():
        if isinstance(value, torch.Tensor):
            value = value.numpy()
        if not isinstance(value, np.ndarray):
            raise StoreError(
                f"split file {path}: entry {key!r} is a {type(value).__name__}, not an array. Fix: {NPZ_FIX}"
            )
        out[key] = value
    return out


def split_pairs(d: dict[str, np.ndarray], where: str) -> LinkSplit:
    """(positives [E, 2], negatives or None) from one OGB split dict: pairs ("edge", "edge_neg") or a source
    with its target and its negative targets ("source_node", "target_node", "target_node_neg" [E, K])."""
    unknown = sorted(set(d) - set(KNOWN_KEYS))
    if unknown:
        raise StoreError(f"{where}: unknown entries {unknown}; expected some of {KNOWN_KEYS}. Fix: {NPZ_FIX}")
    if "edge" in d:
        return d["edge"], d.get("edge_neg")
    if "source_node" in d and "target_node" in d:
        pos = np.stack([np.asarray(d["source_node"]).ravel(), np.asarray(d["target_node"]).ravel()], axis=1)
        return pos, d.get("target_node_neg")
    raise StoreError(f"{where}: no positive edges (neither 'edge' nor 'source_node'/'target_node'). Fix: {NPZ_FIX}")


def _ids(name: str, split: str, kind: str, arr: np.ndarray, n: int, width: int | None) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(a == np.round(a))):
        raise StoreError(
            f"{name}: {kind} edges of split {split!r} are {a.dtype}, not node ids. Fix: give integer node ids"
        )
    a = a.astype(np.int64)
    if a.ndim != 2 or (width is not None and a.shape[1] != width):
        want = f"[E, {width}]" if width else "[E, K]"
        raise StoreError(
            f"{name}: {kind} edges of split {split!r} have shape {a.shape}, expected {want}. "
            "Fix: one row per edge (source, target)"
        )
    bad = np.flatnonzero(((a < 0) | (a >= n)).any(axis=1))
    if bad.size:
        raise StoreError(
            f"{name}: {kind} edge {bad[0]} of split {split!r} ({a[bad[0]].tolist()}) refers to a node "
            f"outside [0, {n}) ({bad.size} such rows). Fix: node ids must be below the node count "
            "(raw/num-node-list.csv.gz, or --nodes)"
        )
    return np.ascontiguousarray(a)


def checked_link_splits(name: str, splits: dict[str, LinkSplit], num_nodes: int, metric: str) -> dict[str, LinkSplit]:
    """Splits as int64 arrays, every node id checked; validation and test need the negatives ``metric`` ranks
    positives against (Hits@K and ROC-AUC: pairs [E, 2]; MRR: K negative targets per positive, [E, K])."""
    missing = [s for s in LINK_SPLITS if s not in splits]
    if missing:
        raise StoreError(f"{name}: link splits {missing} are missing. Fix: give train, valid and test edges")
    out: dict[str, LinkSplit] = {}
    for split in LINK_SPLITS:
        pos, neg = splits[split]
        pos = _ids(name, split, "positive", pos, num_nodes, 2)
        if len(pos) == 0:
            raise StoreError(f"{name}: split {split!r} has no positive edges. Fix: give at least one edge per split")
        if neg is not None:
            neg = _ids(name, split, "negative", neg, num_nodes, None if metric == "mrr" else 2)
            if metric == "mrr" and len(neg) != len(pos):
                raise StoreError(
                    f"{name}: MRR needs one row of negative targets per positive edge; split "
                    f"{split!r} has {len(pos)} positives and {len(neg)} rows. Fix: give "
                    "target_node_neg [E, K]"
                )
        elif split != "train":
            raise StoreError(
                f"{name}: split {split!r} has no negative edges, but metric {metric} ranks positive edges "
                "against negative ones. Fix: give them (edge_neg, or target_node_neg for MRR), or "
                "build the store with --link-split to sample them"
            )
        out[split] = (pos, neg)
    return out
