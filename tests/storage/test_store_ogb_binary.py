"""OGB's binary layout (ogbn-papers100M): raw/data.npz + raw/node-label.npz, read in blocks."""

from __future__ import annotations

import gzip
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from store_helpers import SMALL_CHUNKS, quiet

from storage import StoreError, open_store, prepare
from storage.sources import npz as npz_mod
from storage.sources import ogb_binary
from storage.sources.npz import NpzFile
from storage.sources.ogb_binary import ogb_binary_source
from storage.sources.ogb_meta import ogb_info

N, E, DIM, CLASSES = 600, 4000, 12, 172


def write_csv(path: Path, ids: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{int(i)}\n" for i in ids))


def make_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    edge_index = rng.integers(0, N, size=(2, E), dtype=np.int64)
    edge_index[:, :5] = [[3, 3, 7, 7, 9], [3, 5, 5, 5, 1]]  # a self-loop and a duplicate
    node_feat = rng.standard_normal((N, DIM)).astype(np.float16)
    node_label = rng.integers(0, CLASSES, size=(N, 1)).astype(np.float64)
    node_label[rng.random(N) < 0.3] = np.nan
    perm = rng.permutation(N)
    return {
        "edge_index": edge_index,
        "node_feat": node_feat,
        "node_label": node_label,
        "train": perm[:300],
        "valid": perm[300:400],
        "test": perm[400:450],
    }


def make_binary_folder(
    root: Path, a: dict[str, np.ndarray], compressed: bool, split: str = "time", fortran_edges: bool = False
) -> Path:
    """An unzipped folder as OGB ships papers100M-bin (what ogb's read_binary_graph_raw reads)."""
    (root / "raw").mkdir(parents=True, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    edge_index = np.asfortranarray(a["edge_index"]) if fortran_edges else a["edge_index"]
    save(
        root / "raw" / "data.npz",
        edge_index=edge_index,
        node_feat=a["node_feat"],
        num_nodes_list=np.array([N]),
        num_edges_list=np.array([a["edge_index"].shape[1]]),
        node_year=np.arange(N, dtype=np.int64)[:, None],
    )
    save(root / "raw" / "node-label.npz", node_label=a["node_label"])
    for part in ("train", "valid", "test"):
        write_csv(root / "split" / split / f"{part}.csv.gz", a[part])
    (root / "RELEASE_v1.txt").write_text("")
    return root


def expected_csr(edge_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    src, dst = edge_index
    order = np.lexsort((src, dst))
    indptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=N), out=indptr[1:])
    return indptr, src[order]


def expected_labels(node_label: np.ndarray) -> np.ndarray:
    col = node_label[:, 0]
    return np.where(np.isnan(col), -1, np.nan_to_num(col)).astype(np.int64)


def check_store(store, a: dict[str, np.ndarray]) -> None:
    m = store.meta
    assert (m.num_nodes, m.num_edges, m.feature_dim) == (N, E, DIM)
    indptr, indices = expected_csr(a["edge_index"])
    np.testing.assert_array_equal(store.indptr(), indptr)
    np.testing.assert_array_equal(store.indices(), indices)
    np.testing.assert_array_equal(store.features(), a["node_feat"].astype(np.float32))
    np.testing.assert_array_equal(store.labels(), expected_labels(a["node_label"]))
    for part in ("train", "valid", "test"):
        np.testing.assert_array_equal(store.split(part), np.sort(a[part]))
    store.verify()


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_papers100m_from_dir(compressed, tmp_path):
    a = make_arrays()
    root = make_binary_folder(tmp_path / "papers100M-bin", a, compressed)
    store = open_store(
        prepare("ogbn-papers100M", from_dir=root, data_dir=tmp_path, progress=quiet, layout=SMALL_CHUNKS)
    )
    m = store.meta
    assert (m.ogb_name, m.task_type, m.metric, m.num_classes, m.num_tasks) == (
        "ogbn-papers100M",
        "multiclass",
        "acc",
        CLASSES,
        1,
    )
    assert m.directed and m.source["split"] == "time" and m.source["format"] == "binary"
    check_store(store, a)


def test_float16_features_kept(tmp_path):
    a = make_arrays(1)
    root = make_binary_folder(tmp_path / "p", a, compressed=True)
    store = open_store(
        prepare(
            "ogbn-papers100M",
            from_dir=root,
            data_dir=tmp_path,
            progress=quiet,
            feature_dtype="float16",
            layout=SMALL_CHUNKS,
        )
    )
    np.testing.assert_array_equal(store.features(), a["node_feat"].astype(np.float32))


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_small_blocks_give_the_same_store(compressed, tmp_path, monkeypatch):
    a = make_arrays(2)
    root = make_binary_folder(tmp_path / "p", a, compressed, fortran_edges=compressed)
    whole = open_store(
        prepare("ogbn-papers100M", from_dir=root, out=tmp_path / "big", progress=quiet, layout=SMALL_CHUNKS)
    )
    monkeypatch.setattr(npz_mod, "BLOCK_BYTES", 1000)  # odd size: blocks never align with chunks
    monkeypatch.setattr(ogb_binary, "EDGE_BLOCK_BYTES", 1000)
    source = ogb_binary_source(root, "ogbn-papers100M", ogb_info("ogbn-papers100M"))
    edge_blocks = [len(s) for s, _, _ in source.edge_blocks()]
    feat_blocks = [len(b) for b in source.feature_blocks()]
    assert len(edge_blocks) > 10 and max(edge_blocks) <= 1000 // 16 and sum(edge_blocks) == E
    assert len(feat_blocks) > 10 and max(feat_blocks) <= 1000 // (2 * DIM) and sum(feat_blocks) == N
    small = open_store(
        prepare("ogbn-papers100M", from_dir=root, out=tmp_path / "small", progress=quiet, layout=SMALL_CHUNKS)
    )
    assert small.meta.fingerprint == whole.meta.fingerprint
    check_store(small, a)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("axis", [0, 1])
def test_member_blocks_every_layout(compressed, order, axis, tmp_path):
    rng = np.random.default_rng(3)
    arr = np.asarray(rng.standard_normal((37, 23)), order=order)
    path = tmp_path / "a.npz"
    (np.savez_compressed if compressed else np.savez)(path, x=arr, v=np.arange(50))
    m = NpzFile(path).member("x")
    assert m.fortran_order == (order == "F") and m.compressed == compressed
    for block_bytes in (1, 8 * 23 * 5 + 3, 1 << 20):
        blocks = list(m.iter_blocks(axis, block_bytes))
        np.testing.assert_array_equal(np.concatenate(blocks, axis=axis), arr)
    v = NpzFile(path).member("v")
    np.testing.assert_array_equal(np.concatenate(list(v.iter_blocks(0, 64)))[:, 0], np.arange(50))
    np.testing.assert_array_equal(v.read_all(), np.arange(50))


_PEAK_OF_READING = """
import sys, tracemalloc
import numpy as np
from storage.sources.npz import NpzFile
m = NpzFile(sys.argv[1]).member("node_feat")
total = 0.0
tracemalloc.start()
for block in m.iter_blocks(0, 16 << 10):
    total += float(block[:, 0].astype(np.float64).sum())
print(tracemalloc.get_traced_memory()[1], total)
"""


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_reading_memory_is_bounded(compressed, tmp_path):
    arr = np.random.default_rng(4).standard_normal((8192, 64)).astype(np.float16)  # 1 MiB
    path = tmp_path / "big.npz"
    (np.savez_compressed if compressed else np.savez)(path, node_feat=arr)
    # a process of its own: tracemalloc counts every thread, and a test session has other threads allocating
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_READING, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    peak, total = int(out[0]), float(out[1])
    assert total == pytest.approx(float(arr[:, 0].astype(np.float64).sum()))
    assert peak < 256 << 10, f"peak {peak} bytes while reading a 1 MiB array in 16 KiB blocks"


def test_generic_binary_folder_inferred_metadata(tmp_path):
    a = make_arrays(5)
    root = make_binary_folder(tmp_path / "mybin", a, compressed=False, split="random")
    store = open_store(prepare("mybin", from_dir=root, data_dir=tmp_path, progress=quiet))
    m = store.meta
    assert (m.ogb_name, m.task_type, m.metric, m.source["split"]) == (None, "multiclass", "acc", "random")
    assert m.num_classes == int(np.nanmax(a["node_label"])) + 1
    check_store(store, a)


def test_counts_are_checked_against_the_files(tmp_path):
    a = make_arrays(6)
    root = make_binary_folder(tmp_path / "p", a, compressed=False)
    np.savez(
        root / "raw" / "data.npz",
        edge_index=a["edge_index"],
        node_feat=a["node_feat"],
        num_nodes_list=np.array([N]),
        num_edges_list=np.array([E + 1]),
    )
    with pytest.raises(StoreError, match=r"edge_index has shape \(2, 4000\) but num_edges_list says 4001"):
        prepare("ogbn-papers100M", from_dir=root, data_dir=tmp_path, progress=quiet)
    np.savez(
        root / "raw" / "data.npz",
        edge_index=a["edge_index"],
        node_feat=a["node_feat"][:-1],
        num_nodes_list=np.array([N]),
        num_edges_list=np.array([E]),
    )
    with pytest.raises(StoreError, match="node_feat has shape"):
        prepare("ogbn-papers100M", from_dir=root, data_dir=tmp_path, progress=quiet)
    (root / "raw" / "node-label.npz").unlink()
    with pytest.raises(StoreError, match="node-label.npz is missing"):
        prepare("ogbn-papers100M", from_dir=root, data_dir=tmp_path, progress=quiet)


def test_truncated_member_is_reported(tmp_path):
    a = make_arrays(7)
    root = make_binary_folder(tmp_path / "p", a, compressed=False)
    data = root / "raw" / "data.npz"
    raw = data.read_bytes()
    with zipfile.ZipFile(data) as zf:
        info = zf.getinfo("edge_index.npy")
    cut = info.header_offset + 200  # inside edge_index's data: the zip's directory is lost too
    data.write_bytes(raw[:cut])
    with pytest.raises(StoreError, match="data.npz"):
        prepare("ogbn-papers100M", from_dir=root, data_dir=tmp_path, progress=quiet)


def test_download_binary_zip(http_root, tmp_path):
    www, url = http_root
    a = make_arrays(8)
    folder = make_binary_folder(tmp_path / "src" / "papers100M-bin", a, compressed=True)
    (www / "ogb").mkdir()
    with zipfile.ZipFile(www / "ogb" / "papers100M-bin.zip", "w") as zf:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                zf.write(f, f"papers100M-bin/{f.relative_to(folder).as_posix()}")
    data = tmp_path / "data"
    store = open_store(prepare("ogbn-papers100M", mirror=url, data_dir=data, progress=quiet))
    assert store.meta.ogb_name == "ogbn-papers100M" and store.meta.num_classes == CLASSES
    assert (data / "raw" / "papers100M-bin" / "raw" / "data.npz").is_file()
    check_store(store, a)
