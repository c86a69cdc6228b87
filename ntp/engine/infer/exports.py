"""Where a rank's rows of an inference job go, and the node pairs it reads.

Zarr: one group whose arrays (``pred``, ``prob`` or ``embedding``) are indexed by node id, written by all ranks
at once, each chunk by one rank (:func:`write_zarr_rows`). Parquet: one dataset folder, one file per rank
(``part-00000.parquet``, ...; rank order is node order), each written by its rank at the same time as the others, in row groups: memory is bounded by a row group, not by the rank's rows.
A 2-D column (probabilities, embeddings) is a fixed-size list of float32. ``_ntp.json`` (ignored by Parquet readers,
as its name starts with "_") says what the dataset holds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

#: Rows per Parquet row group (and per Zarr chunk): what a rank converts and holds at a time.
ROW_GROUP = 65536
DESCRIPTION = "_ntp.json"


def part_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"part-{rank:05d}.parquet"


def _arrow_type(values: np.ndarray):
    import pyarrow as pa

    scalar = pa.from_numpy_dtype(values.dtype)
    return scalar if values.ndim == 1 else pa.list_(scalar, values.shape[1])


def _arrow_column(values: np.ndarray):
    import pyarrow as pa

    if values.ndim == 1:
        return pa.array(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).reshape(-1)), values.shape[1])


def write_parquet_part(
    folder: str | Path, rank: int, columns: dict[str, np.ndarray], row_group: int = ROW_GROUP
) -> Path:
    """This rank's rows (every column has the same number of rows) as ``part-<rank>.parquet`` in ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, _arrow_type(values)) for name, values in columns.items()])
    rows = len(next(iter(columns.values())))
    path = part_path(folder, rank)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, row_group):
            part = {name: _arrow_column(values[start : start + row_group]) for name, values in columns.items()}
            writer.write_table(pa.table(part, schema=schema), row_group_size=row_group)
        if rows == 0:
            writer.write_table(schema.empty_table())
    return path


def write_description(folder: str | Path, description: dict) -> Path:
    path = Path(folder) / DESCRIPTION
    path.write_text(json.dumps(description, indent=2, default=str))
    return path


def read_pairs(path: str | Path) -> np.ndarray:
    """Node pairs [k, 2] (int64) from a ``.npy`` array [k, 2], a ``.parquet`` file with columns ``src`` and ``dst``,
    or a ``.csv``/``.txt`` file of two integer columns (a header line is skipped). ValueError says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pairs file {path} does not exist; pass a .npy, .parquet or .csv file of node pairs")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        pairs = np.load(path, allow_pickle=False)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        missing = {"src", "dst"} - set(table.column_names)
        if missing:
            raise ValueError(f"pairs file {path} lacks column(s) {sorted(missing)}; it needs src and dst")
        pairs = np.stack([table["src"].to_numpy(), table["dst"].to_numpy()], axis=1)
    elif suffix in (".csv", ".txt"):
        pairs = _read_text_pairs(path)
    else:
        raise ValueError(f"pairs file {path}: unknown format {suffix!r}; use .npy, .parquet or .csv")
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError(f"pairs file {path} holds {pairs.dtype} {pairs.shape}; expected integer node ids [k, 2]")
    return pairs.astype(np.int64)


def _read_text_pairs(path: Path) -> np.ndarray:
    with path.open() as f:
        first = f.readline()
    header = any(c.isalpha() for c in first)
    delimiter = "," if "," in first else None
    return np.loadtxt(path, dtype=np.int64, delimiter=delimiter, skiprows=int(header), ndmin=2)


def zarr_chunk_rows(columns: dict[str, np.ndarray], row_group: int) -> int:
    """Rows per Zarr chunk: about 1 MiB of the widest column (a power of two, as the store's feature chunks), at
    most ``row_group``."""
    widest = max(int(np.prod(v.shape[1:])) * v.dtype.itemsize for v in columns.values())
    return max(1, min(row_group, 2 ** round(math.log2(max(1, (1 << 20) // widest)))))


def write_zarr_rows(
    folder: str | Path,
    rows: tuple[int, int],
    num_nodes: int,
    columns: dict[str, np.ndarray],
    row_group: int,
    is_main: bool,
) -> None:
    """Every rank's rows into one Zarr group of arrays indexed by node id (the store's codecs: uncompressed,
    CRC32C per chunk). A chunk is written by one rank only (two writers of one chunk corrupt it): the rank where
    the chunk starts, which receives the rest of its rows from the next ranks (at most one chunk each)."""
    import zarr

    from ntp.engine.distributed.collectives import all_gather_objects, barrier
    from storage.layout import create_array

    values = {name: v for name, v in columns.items() if name != "node_id"}  # the index is the node id
    chunk = zarr_chunk_rows(values, row_group)
    start, stop = rows
    boundary = min(stop, -(-start // chunk) * chunk)  # the first chunk that starts in this rank's rows
    heads = all_gather_objects((start, {name: v[: boundary - start] for name, v in values.items()}))
    if is_main:
        group = zarr.open_group(str(folder), mode="w", zarr_format=3)
        for name, v in values.items():
            create_array(group, name, (num_nodes, *v.shape[1:]), v.dtype.str, (chunk, *v.shape[1:]))
    barrier()  # the arrays exist before anyone writes
    if boundary < stop:
        end = min(num_nodes, -(-stop // chunk) * chunk)
        later = [head for begin, head in heads if stop <= begin < end]
        group = zarr.open_group(str(folder), mode="r+")
        for name, v in values.items():
            for a in range(boundary, end, chunk):  # chunk by chunk: no copy of the rank's rows
                b = min(a + chunk, end)
                group[name][a:b] = (
                    v[a - start : b - start]
                    if b <= stop
                    else np.concatenate([v[a - start :], *(head[name] for head in later)])
                )
    barrier()  # every chunk written before the job ends
