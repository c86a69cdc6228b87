"""Open and read a graph store: the only way training code reads graph data."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from storage import hetero_arrays
from storage import schema as S
from storage.layout import expected_chunk_files
from storage.location import Location, location_of
from storage.schema import StoreError, StoreMeta, parse_meta, store_problem

GENERIC_FIX = "delete it and run `ntp data prepare` again with the original options"
OBJECT_STORE_FIX = (
    "check the URL and the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile), "
    "and AWS_ENDPOINT_URL for an S3-compatible server other than AWS"
)


@dataclass
class CSRBlock:
    """Rows [row_start, row_stop) of the in-edge CSR; indptr is rebased to start at 0."""

    row_start: int
    row_stop: int
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None


def _read_attrs(where: Location) -> dict[str, Any]:
    try:
        if not where.exists():
            raise store_problem(
                where,
                "no such store directory" if where.is_local else "nothing is stored there",
                "build it with `ntp data prepare NAME`" + ("" if where.is_local else " and upload the folder there"),
            )
        doc = json.loads(where.read_text("zarr.json"))
    except FileNotFoundError:
        raise store_problem(where, "zarr.json is missing (not a store, or an unfinished build)", GENERIC_FIX) from None
    except ImportError as e:
        raise store_problem(where, "cannot read it here", str(e)) from None
    except (OSError, ValueError) as e:  # remote: access denied is an OSError too
        fix = GENERIC_FIX if where.is_local or isinstance(e, ValueError) else OBJECT_STORE_FIX
        raise store_problem(where, f"zarr.json is unreadable ({e})", fix) from None
    except StoreError:
        raise
    except Exception as e:  # the object store's client: no credentials, no server, no bucket
        raise store_problem(where, f"cannot be reached ({type(e).__name__}: {e})", OBJECT_STORE_FIX) from None
    if not isinstance(doc, dict):
        raise store_problem(
            where,
            f"zarr.json holds a JSON {type(doc).__name__}, not an object "
            "(not a graph store, or an edited metadata file)",
            GENERIC_FIX,
        )
    attrs = doc.get("attributes")
    if doc.get("node_type") != "group" or not isinstance(attrs, dict):
        raise store_problem(where, "zarr.json does not describe a graph store group", GENERIC_FIX)
    return attrs


def is_graph_store(path: str | os.PathLike[str]) -> bool:
    """Whether `path` holds one of our stores (its zarr.json carries our metadata), even a damaged one."""
    try:
        attrs = _read_attrs(location_of(path))
    except StoreError:
        return False
    return "schema_version" in attrs and "fingerprint" in attrs and "rebuild_command" in attrs


def _fix_from(attrs: dict[str, Any], where: Location) -> str:
    """The recorded rebuild command, pointed at where the store is now (it may have moved); a store on object
    storage is rebuilt in a folder and uploaded again."""
    cmd = attrs.get("rebuild_command")
    if not isinstance(cmd, str) or not cmd:
        return GENERIC_FIX
    upload = "" if where.is_local else f", then upload the folder to {where} again"
    try:
        argv = shlex.split(cmd)
    except ValueError:
        return f"rebuild it with `{cmd}`{upload}"
    if "--out" in argv[:-1] and where.is_local:
        argv[argv.index("--out") + 1] = str(where)
    return f"rebuild it with `{shlex.join(argv)}`{upload}"


def _expected_arrays(meta: StoreMeta) -> dict[str, tuple[tuple[int, ...], str]]:
    n, e = meta.num_nodes, meta.num_edges
    feat = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}[meta.feature_dtype]
    arrays = {
        S.INDPTR: ((n + 1,), "int64"),
        S.INDICES: ((e,), meta.index_dtype),
        S.IN_DEGREE: ((n,), "int64"),
        S.OUT_DEGREE: ((n,), "int64"),
        S.FEATURES: ((n, meta.feature_dim), feat),
    }
    if meta.has_edge_weights:
        arrays[S.WEIGHTS] = ((e,), "float32")
    if S.T_INDICES in meta.checksums:
        arrays[S.T_INDICES] = ((e,), meta.index_dtype)
    if meta.hetero:
        arrays.update(hetero_arrays.expected_arrays(meta.hetero, meta.index_dtype, feat))
    if meta.task_type == "link":  # edge splits instead of labels and node splits
        arrays.update({name: (None, "int64") for name in meta.checksums if name.startswith(S.LINK_PREFIX)})
        return arrays
    arrays[S.LABELS] = ((n,), "int64") if meta.task_type == "multiclass" else ((n, meta.num_tasks), "float32")
    for name in meta.split_names:
        arrays[S.SPLIT_PREFIX + name] = (None, "int64")  # length known only from the array
    return arrays


class GraphStore:
    """A validated, read-only graph store. Every method reads only the chunks it needs."""

    def __init__(self, location: Location, meta: StoreMeta) -> None:
        self.location = location
        self.meta = meta
        self._fix = _fix_from({"rebuild_command": meta.rebuild_command}, location)
        try:
            self._group = location.open_group()
        except Exception as e:  # zarr rejects an edited zarr.json in many ways
            raise store_problem(location, f"zarr.json is not a valid Zarr group ({e})", self._fix) from None
        self._arrays: dict[str, zarr.Array] = {}

    def __repr__(self) -> str:
        m = self.meta
        return f"GraphStore({str(self.location)!r}, {m.name}: {m.num_nodes} nodes, {m.num_edges} edges)"

    def _array(self, name: str) -> zarr.Array:
        if name not in self._arrays:
            try:
                self._arrays[name] = self._group[name]
            except (KeyError, FileNotFoundError, ValueError) as e:
                raise store_problem(self.location, f"array {name!r} is missing ({e})", self._fix) from None
        return self._arrays[name]

    def _read(self, name: str, sel: Any = slice(None)) -> np.ndarray:
        try:
            return np.asarray(self._array(name)[sel])
        except StoreError:
            raise
        except Exception as e:  # checksum mismatch, truncated or missing chunk
            raise store_problem(self.location, f"array {name!r} cannot be read: {e}", self._fix) from None

    # Topology -----------------------------------------------------------------------------
    def indptr(self) -> np.ndarray:
        return self._read(S.INDPTR)

    def indices(self) -> np.ndarray:
        return self._read(S.INDICES)

    def read_into(self, name: str, out: np.ndarray, threads: int = 8) -> np.ndarray:
        """1-d array ``name`` (e.g. ``S.INDICES``) read straight into ``out`` (same length, any dtype it casts to
        without loss), a few chunks per block, blocks in parallel: no whole-array temporary."""
        arr = self._array(name)
        if out.shape != tuple(arr.shape):
            raise ValueError(f"array {name!r} has shape {tuple(arr.shape)}, the output {out.shape}")
        step = arr.chunks[0] * 4

        def block(start: int) -> None:
            out[start : start + step] = self._read(name, slice(start, start + step))

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(block, range(0, arr.shape[0], step)))
        return out

    def edge_weights(self) -> np.ndarray | None:
        return self._read(S.WEIGHTS) if self.meta.has_edge_weights else None

    def topology(self, row_start: int = 0, row_stop: int | None = None) -> CSRBlock:
        """Rows [row_start, row_stop) of the in-edge CSR (sources of edges into those rows)."""
        n = self.meta.num_nodes
        row_stop = n if row_stop is None else row_stop
        if not 0 <= row_start <= row_stop <= n:
            raise ValueError(f"row range [{row_start}, {row_stop}) is not inside [0, {n}]")
        ptr = self._read(S.INDPTR, slice(row_start, row_stop + 1))
        a, b = int(ptr[0]), int(ptr[-1])
        weights = self._read(S.WEIGHTS, slice(a, b)) if self.meta.has_edge_weights else None
        return CSRBlock(row_start, row_stop, ptr - a, self._read(S.INDICES, slice(a, b)), weights)

    def in_degrees(self) -> np.ndarray:
        return self._read(S.IN_DEGREE)

    def out_degrees(self) -> np.ndarray:
        return self._read(S.OUT_DEGREE)

    # Node data ----------------------------------------------------------------------------
    def features(self, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Features [rows, cols] as float32 (fp16/bf16 stores are upcast)."""
        sel = (_check_slice(rows, "rows"), _check_slice(cols, "cols"))
        data = self._read(S.FEATURES, sel)
        if self.meta.feature_dtype == "bfloat16":
            return (data.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return data.astype(np.float32, copy=False)

    def labels(self) -> np.ndarray:
        """Node labels; empty for a link-prediction store (its targets are edges: link_split)."""
        return np.zeros(0, np.int64) if self.meta.task_type == "link" else self._read(S.LABELS)

    def split(self, name: str, k: int = 0) -> np.ndarray:
        """Sorted int64 vertex ids of a split ("train", "valid", "test") of split set ``k`` (0: the store's first
        or only one; storage.schema.split_array)."""
        if self.meta.task_type == "link":  # edge splits, not vertices: link_split
            return np.zeros(0, np.int64)
        sets = S.split_sets(self.meta.split_names)
        if not 0 <= k < sets:
            raise ValueError(
                f"store {self.location} has {sets} split set(s) (0..{sets - 1}), not {k}: pass --split 0..{sets - 1}"
            )
        name = S.split_array(name, k)
        if name not in self.meta.split_names:
            raise ValueError(f"store {self.location} has no split {name!r}; it has {self.meta.split_names}")
        return self._read(S.SPLIT_PREFIX + name)

    def link_split(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(positive pairs [E, 2], negatives or None) of a link-prediction split (see storage.schema.LINK_PREFIX)."""
        self._check_link_split(name)
        neg = S.link_array(name, "neg")
        return self._read(S.link_array(name, "pos")), self._read(neg) if neg in self.meta.checksums else None

    def _check_link_split(self, name: str) -> None:
        if self.meta.task_type != "link" or name not in self.meta.split_names:
            raise ValueError(
                f"store {self.location} has no link split {name!r} (task {self.meta.task_type}, "
                f"splits {self.meta.split_names})"
            )

    def link_split_shapes(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """Shapes of a link-prediction split's positives and negatives (None: it has none), without reading them."""
        self._check_link_split(name)
        neg = S.link_array(name, "neg")
        shape = lambda array: tuple(self._array(array).shape)  # noqa: E731
        return shape(S.link_array(name, "pos")), shape(neg) if neg in self.meta.checksums else None

    def relation_csr(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(indptr over the destination type's rows, source ids local to the source type) of one relation of a
        heterogeneous store (key ``src___rel___dst``, or the relation's name when unambiguous)."""
        if not self.meta.hetero:
            raise StoreError(
                f"store {self.location} is homogeneous: it has no relation {key!r}. Fix: build it from "
                "an OGB heterogeneous folder (raw/num-node-dict.csv.gz, raw/relations/...)"
            )
        rel = hetero_arrays.relation_index(self.meta.hetero, key)
        ptr_name, idx_name = hetero_arrays.relation_arrays(rel["key"])
        return self._read(ptr_name), self._read(idx_name)

    def type_features(self, node_type: str, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Features [rows, cols] of one node type (local ids) as float32; [n, 0] for a featureless type."""
        types = {t["name"]: t for t in self.meta.hetero.get("node_types", [])}
        if node_type not in types:
            raise StoreError(f"store {self.location} has no node type {node_type!r}. Fix: use one of {sorted(types)}")
        t = types[node_type]
        if not t["feature_dim"]:
            return np.zeros((t["count"], 0), np.float32)[_check_slice(rows, "rows")]
        data = self._read(
            hetero_arrays.feature_array(node_type), (_check_slice(rows, "rows"), _check_slice(cols, "cols"))
        )
        if self.meta.feature_dtype == "bfloat16":
            return (data.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return data.astype(np.float32, copy=False)

    # Validation ---------------------------------------------------------------------------
    def check_structure(self) -> None:
        """Fast check: arrays exist with the right shapes and dtypes, every chunk file has its size."""
        for name, (shape, dtype) in _expected_arrays(self.meta).items():
            arr = self._array(name)
            if shape is not None and tuple(arr.shape) != shape:
                raise store_problem(
                    self.location,
                    f"array {name!r} has shape {tuple(arr.shape)} but the metadata says {shape} (mismatched counts)",
                    self._fix,
                )
            if np.dtype(arr.dtype) != np.dtype(dtype):
                raise store_problem(self.location, f"array {name!r} has dtype {arr.dtype}, expected {dtype}", self._fix)
            self._check_chunks(name, arr)
        ptr = self._read(S.INDPTR, slice(self.meta.num_nodes, self.meta.num_nodes + 1))
        if int(ptr[0]) != self.meta.num_edges:
            raise store_problem(
                self.location,
                f"indptr ends at {int(ptr[0])} but the metadata says {self.meta.num_edges} edges (mismatched counts)",
                self._fix,
            )

    def _check_chunks(self, name: str, arr: zarr.Array) -> None:
        coords, size = expected_chunk_files(tuple(arr.shape), tuple(arr.chunks), arr.dtype.itemsize)
        sizes = self.location.file_sizes(f"{name}/c")  # one listing: one request per 1000 objects on S3
        for c in coords:
            f = "/".join([name, "c", *map(str, c)])
            actual = sizes.get(f)
            if actual is None:
                raise store_problem(self.location, f"chunk {f} of array {name!r} is missing", self._fix)
            if actual != size:
                raise store_problem(
                    self.location,
                    f"chunk {f} of array {name!r} has {actual} bytes, expected {size} (truncated or corrupt)",
                    self._fix,
                )

    def verify(self) -> None:
        """Deep check: read every array (chunk checksums) and compare content hashes."""
        for name, expected in self.meta.checksums.items():
            arr = self._array(name)
            h = hashlib.blake2b(digest_size=16)
            step = arr.chunks[0] * (8 if arr.ndim == 1 else 1)
            for start in range(0, arr.shape[0], step):
                h.update(np.ascontiguousarray(self._read(name, slice(start, start + step))).tobytes())
            if h.hexdigest() != expected:
                raise store_problem(self.location, f"array {name!r} does not match its checksum", self._fix)
        self._verify_metadata()

    def _verify_metadata(self) -> None:
        """Recompute what the arrays tell about the metadata: class count, then the fingerprint."""
        m, classes = self.meta, None
        if m.task_type == "multiclass" and m.num_nodes:
            low, high = self._label_range()
            classes = high + 1
            if low < -1 or classes > m.num_classes:
                raise store_problem(
                    self.location,
                    f"num_classes is {m.num_classes} but the labels range over "
                    f"[{low}, {high}] (mismatched counts: the metadata was edited)",
                    self._fix,
                )
        if S.fingerprint(m.to_dict()) != m.fingerprint:
            hint = (
                f"; num_classes is {m.num_classes} but the labels use {classes} classes"
                if classes is not None and classes != m.num_classes
                else ""
            )
            raise store_problem(
                self.location,
                "the metadata does not match its fingerprint (one of "
                f"{', '.join(S.FINGERPRINT_FIELDS)} was edited{hint})",
                self._fix,
            )

    def _label_range(self) -> tuple[int, int]:
        """(min, max) of the multiclass labels, read chunk by chunk."""
        arr = self._array(S.LABELS)
        step = arr.chunks[0] * 16
        low, high = -1, -1
        for start in range(0, arr.shape[0], step):
            block = self._read(S.LABELS, slice(start, start + step))
            low = int(block.min()) if start == 0 else min(low, int(block.min()))
            high = max(high, int(block.max()))
        return low, high


def _check_slice(s: slice | None, what: str) -> slice:
    if s is None:
        return slice(None)
    if not isinstance(s, slice) or s.step not in (None, 1):
        raise ValueError(f"{what} must be None or slice(start, stop) with step 1, got {s!r}")
    return s


def open_store(path: str | os.PathLike[str] | Location) -> GraphStore:
    """Open a store (a folder, or a URL such as ``s3://bucket/store``: storage.location), validating its metadata
    and structure; raise StoreError naming the fix."""
    where = location_of(path)
    attrs = _read_attrs(where)
    fix = _fix_from(attrs, where)
    try:
        meta = parse_meta(attrs)
    except ValueError as e:
        raise store_problem(where, str(e), fix) from None
    store = GraphStore(where, meta)
    store.check_structure()
    return store
