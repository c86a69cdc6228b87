"""OGB-layout folders with OGB's metadata: a proteins-like graph (no node features, 112 tasks)."""

from __future__ import annotations

import gzip

import numpy as np
from store_helpers import quiet

from storage import open_store, prepare


def write_csv(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def test_proteins_like_layout(tmp_path):
    root = tmp_path / "proteins"
    edges = np.array([[0, 1], [1, 2], [3, 4]])
    efeat = np.arange(24, dtype=np.float32).reshape(3, 8) / 10
    labels = (np.arange(6 * 112).reshape(6, 112) % 3 == 0).astype(int)
    write_csv(root / "raw/edge.csv.gz", edges)
    write_csv(root / "raw/edge-feat.csv.gz", efeat)
    write_csv(root / "raw/node-label.csv.gz", labels)
    write_csv(root / "raw/num-node-list.csv.gz", [6])
    write_csv(root / "raw/num-edge-list.csv.gz", [3])
    for part, ids in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        write_csv(root / f"split/species/{part}.csv.gz", ids)
    store = open_store(prepare("ogbn-proteins", from_dir=root, data_dir=tmp_path, progress=quiet))
    m = store.meta
    assert (m.task_type, m.metric, m.num_tasks, m.ogb_name, m.directed) == (
        "binary",
        "rocauc",
        112,
        "ogbn-proteins",
        False,
    )
    assert m.num_edges == 6 and m.feature_dim == 8 and m.source["split"] == "species"
    y = store.labels()
    assert y.dtype == np.float32 and y.shape == (6, 112)
    np.testing.assert_array_equal(y, labels)
    expected = np.zeros((6, 8), np.float32)
    expected[0], expected[1], expected[2] = efeat[0], (efeat[0] + efeat[1]) / 2, efeat[1]
    expected[3], expected[4] = efeat[2], efeat[2]
    np.testing.assert_allclose(store.features(), expected, rtol=1e-6)
    assert store.split("test").tolist() == [4, 5]
