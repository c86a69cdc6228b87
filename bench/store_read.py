"""Benchmark: reading features and topology from a store vs plain .npy files.

    python bench/store_read.py                         # 500k nodes x 128 features (builds a store)
    python bench/store_read.py --store data/stores/X   # an existing store

Access patterns of a tensor-parallel worker: one row block with all columns, one column
slice (1/workers of the columns) for all rows, and a topology row block. The .npy baseline
is memory-mapped and copied. Files are in the page cache for both (warm reads).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage import open_store, prepare  # noqa: E402
from storage.layout import Layout  # noqa: E402


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, help="existing store (default: build a synthetic one)")
    p.add_argument("--nodes", type=int, default=500_000)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--workers", type=int, default=4, help="column slice = features / workers")
    p.add_argument("--row-block", type=int, default=65_536)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--col-chunk", type=int, default=Layout.feature_col_chunk, help="feature chunk columns")
    p.add_argument("--row-chunk", type=int, default=0, help="feature chunk rows (0: about 1 MiB chunks)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="store-read-"))
    path = args.store or prepare(
        "synthetic",
        nodes=args.nodes,
        avg_degree=10,
        features=args.features,
        out=tmp / "store",
        progress=lambda line: None,
        layout=Layout(feature_col_chunk=args.col_chunk, feature_row_chunk=args.row_chunk),
    )
    store = open_store(path)
    n, f = store.meta.num_nodes, store.meta.feature_dim
    np.save(tmp / "x.npy", store.features())
    np.save(tmp / "indptr.npy", store.indptr())
    np.save(tmp / "indices.npy", store.indices())
    x = np.load(tmp / "x.npy", mmap_mode="r")
    ptr, idx = np.load(tmp / "indptr.npy", mmap_mode="r"), np.load(tmp / "indices.npy", mmap_mode="r")
    r0, r1 = n // 3, min(n, n // 3 + args.row_block)
    w = max(1, f // args.workers)
    c0, c1 = w, min(f, 2 * w)
    itemsize = 4

    def topo_npy() -> None:
        a, b = int(ptr[r0]), int(ptr[r1])
        np.array(ptr[r0 : r1 + 1]), np.array(idx[a:b])

    cases = [
        (
            "features: row block, all columns",
            (r1 - r0) * f * itemsize,
            lambda: store.features(rows=slice(r0, r1)),
            lambda: np.array(x[r0:r1]),
        ),
        (
            f"features: column slice {c0}:{c1}, all rows",
            n * (c1 - c0) * itemsize,
            lambda: store.features(cols=slice(c0, c1)),
            lambda: np.ascontiguousarray(x[:, c0:c1]),
        ),
        ("features: everything", n * f * itemsize, lambda: store.features(), lambda: np.array(x)),
        (
            "topology: row block",
            (r1 - r0) * 8 + int(ptr[r1] - ptr[r0]) * idx.itemsize,
            lambda: store.topology(r0, r1),
            topo_npy,
        ),
    ]
    chunks = store._array("features").chunks
    print(f"store {path}: {n:,} nodes, {store.meta.num_edges:,} edges, {f} features, feature chunks {chunks}")
    print(f"{'access':45} {'MiB':>8} {'store ms':>9} {'npy ms':>8} {'store MB/s':>11} {'npy MB/s':>9}")
    for name, nbytes, via_store, via_npy in cases:
        ts, tn = best_of(via_store, args.repeat), best_of(via_npy, args.repeat)
        print(
            f"{name:45} {nbytes / 2**20:>8.1f} {ts * 1e3:>9.1f} {tn * 1e3:>8.1f} "
            f"{nbytes / ts / 1e6:>11,.0f} {nbytes / tn / 1e6:>9,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
