"""Store schema: version, array names, metadata dataclass and validators."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

SCHEMA_VERSION = 1

TASK_TYPES = ("multiclass", "binary", "multilabel", "link")
METRICS = ("acc", "rocauc", "mrr")  # and "hits@K" (link prediction), see is_metric
FEATURE_DTYPES = ("float32", "float16", "bfloat16")
SPLIT_NAMES = ("train", "valid", "test")
#: --random-splits: labelled vertices a class for train and valid, Shchur et al.'s 20 and 30 (storage.random_splits)
SPLIT_PER_CLASS = "20,30"

# Array names inside the Zarr group.
INDPTR = "indptr"
INDICES = "indices"
#: Column ids of the CSR of A^T (out-edges: each source's targets, sorted); absent from symmetrised stores, where
#: A^T is A, and from stores built before it existed (the transpose is then sorted at start-up).
T_INDICES = "t_indices"
WEIGHTS = "edge_weights"
IN_DEGREE = "in_degree"
OUT_DEGREE = "out_degree"
FEATURES = "features"
LABELS = "labels"
SPLIT_PREFIX = "split/"
#: Link prediction: "link/<split>/pos" [E, 2] source, target; "link/<split>/neg" [E, 2] pairs (Hits@K, ROC-AUC)
#: or [E, K] negative targets of each positive's source (MRR). Stores of task "link" hold no labels or node splits.
LINK_PREFIX = "link/"


def link_array(split: str, kind: str) -> str:
    """Name of a link-prediction array: kind "pos" or "neg"."""
    return f"{LINK_PREFIX}{split}/{kind}"


def split_array(name: str, k: int = 0) -> str:
    """The stored name of split ``name`` (train, valid, test) of split set ``k``: set 0 keeps the plain names (every
    store has it), set k > 0 of a multi-split store (e.g. the heterophilous benchmarks' ten) is ``NAME_k``."""
    return name if k == 0 else f"{name}_{k}"


def split_sets(split_names: tuple[str, ...] | list[str]) -> int:
    """How many split sets a node store holds (1 for most; 10 for the heterophilous benchmarks)."""
    return 1 + sum(1 for s in split_names if re.fullmatch(r"train_[1-9][0-9]*", s))


def is_metric(metric: str) -> bool:
    """acc, rocauc, mrr or hits@K (K >= 1)."""
    return metric in METRICS or re.fullmatch(r"hits@[1-9][0-9]*", metric) is not None


class StoreError(Exception):
    """A store is missing, damaged or cannot be built; the message says how to fix it."""


def store_problem(path: Any, problem: str, fix: str) -> StoreError:
    """Build a StoreError whose message names the store, the problem and the fix."""
    return StoreError(f"graph store {path}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class StoreMeta:
    """Metadata of one graph store (kept in the Zarr group's attributes)."""

    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    num_classes: int
    task_type: str
    metric: str
    num_tasks: int
    ogb_name: str | None
    fingerprint: str
    schema_version: int
    directed: bool
    preprocessing: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    feature_dtype: str = "float32"
    has_edge_weights: bool = False
    split_names: tuple[str, ...] = SPLIT_NAMES
    index_dtype: str = "int32"
    rebuild_command: str = ""
    layout: dict = field(default_factory=dict)
    checksums: dict = field(default_factory=dict)
    build_key: str = ""
    hetero: dict = field(default_factory=dict)  #: node types and relations (storage.hetero_arrays); {}: homogeneous

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {TASK_TYPES}, got {self.task_type!r}")
        if not is_metric(self.metric):
            raise ValueError(f"metric must be one of {METRICS} or hits@K, got {self.metric!r}")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {FEATURE_DTYPES}, got {self.feature_dtype!r}")
        if self.num_nodes < 0 or self.num_edges < 0 or self.feature_dim < 0:
            raise ValueError("num_nodes, num_edges and feature_dim must be >= 0")
        if self.task_type == "multiclass" and self.num_tasks != 1:
            raise ValueError("a multiclass store has num_tasks == 1")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; schema_version comes first."""
        d = dataclasses.asdict(self)
        d["split_names"] = list(self.split_names)
        return {"schema_version": d.pop("schema_version"), **d}


def _field(attrs: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in attrs:
        raise ValueError(f"metadata field {key!r} is missing")
    value = attrs[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"metadata field {key!r} has type {type(value).__name__}, expected {kind}")
    return value


def parse_schema_version(attrs: Mapping[str, Any]) -> int:
    """Return the schema version or raise ValueError saying what is wrong."""
    if "schema_version" not in attrs:
        raise ValueError("no schema_version in the metadata (not a graph store, or an unfinished build)")
    version = attrs["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"schema_version {version!r} is not an integer")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema_version is {version}, this code reads version {SCHEMA_VERSION}")
    return version


def parse_meta(attrs: Mapping[str, Any]) -> StoreMeta:
    """Turn untrusted group attributes into a StoreMeta or raise ValueError naming the field."""
    version = parse_schema_version(attrs)
    ogb_name = attrs.get("ogb_name")
    if ogb_name is not None and not isinstance(ogb_name, str):
        raise ValueError("metadata field 'ogb_name' must be a string or null")
    splits = _field(attrs, "split_names", list)
    if not all(isinstance(s, str) for s in splits):
        raise ValueError("metadata field 'split_names' must be a list of strings")
    return StoreMeta(
        name=_field(attrs, "name", str),
        num_nodes=_field(attrs, "num_nodes", int),
        num_edges=_field(attrs, "num_edges", int),
        feature_dim=_field(attrs, "feature_dim", int),
        num_classes=_field(attrs, "num_classes", int),
        task_type=_field(attrs, "task_type", str),
        metric=_field(attrs, "metric", str),
        num_tasks=_field(attrs, "num_tasks", int),
        ogb_name=ogb_name,
        fingerprint=_field(attrs, "fingerprint", str),
        schema_version=version,
        directed=_field(attrs, "directed", bool),
        preprocessing=_field(attrs, "preprocessing", dict),
        source=_field(attrs, "source", dict),
        feature_dtype=_field(attrs, "feature_dtype", str),
        has_edge_weights=_field(attrs, "has_edge_weights", bool),
        split_names=tuple(splits),
        index_dtype=_field(attrs, "index_dtype", str),
        rebuild_command=_field(attrs, "rebuild_command", str),
        layout=_field(attrs, "layout", dict),
        checksums=_field(attrs, "checksums", dict),
        build_key=_field(attrs, "build_key", str),
        hetero=check_hetero_meta(attrs.get("hetero", {})),
    )


def check_hetero_meta(hetero: Any) -> dict[str, Any]:
    """The metadata's ``hetero`` entry, or ValueError naming what is wrong (an edited zarr.json)."""
    if not isinstance(hetero, dict):
        raise ValueError("metadata field 'hetero' must be an object")
    if not hetero:
        return hetero
    try:
        types = {t["name"]: t for t in hetero["node_types"]}
        if hetero["target"] not in types:
            raise ValueError(f"hetero target type {hetero['target']!r} is not one of the node types {sorted(types)}")
        for r in hetero["relations"]:
            if r["src"] not in types or r["dst"] not in types:
                raise ValueError(f"hetero relation {r['key']!r} names a node type that is not listed")
    except (KeyError, TypeError) as e:
        raise ValueError(f"metadata field 'hetero' lacks {e}") from None
    return hetero


FINGERPRINT_FIELDS = (
    "num_nodes",
    "num_edges",
    "feature_dim",
    "num_classes",
    "task_type",
    "feature_dtype",
    "preprocessing",
    "checksums",
)


def fingerprint(fields: Mapping[str, Any]) -> str:
    """16 hex chars of a hash of the content-defining metadata (an edit of any of them changes it)."""
    content = {k: fields[k] for k in FINGERPRINT_FIELDS}
    if fields.get("hetero"):  # homogeneous stores keep the fingerprint they always had
        content["hetero"] = fields["hetero"]
    blob = json.dumps(content, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def index_dtype_for(num_nodes: int) -> str:
    """int32 source ids when every id fits, else int64."""
    return "int32" if num_nodes < 2**31 else "int64"
