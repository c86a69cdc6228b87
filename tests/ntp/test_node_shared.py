"""The ranks of a node hold one copy of the topology, not one each, and leave nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tests.ntp.spawn import run_on_ranks


def _mapping_of(address: int) -> tuple[str, str] | None:
    """(device:inode, path) of the file mapping that holds ``address`` in this process, None if anonymous."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                inode = fields[4]
                return (f"{fields[3]}:{inode}", " ".join(fields[5:])) if inode != "0" else None
    return None


def shared_topology_worker(store: str) -> dict:
    from ntp.engine.distributed.dist import distributed
    from ntp.engine.graph.data import load_shared
    from storage import open_store

    with distributed(60, "cpu") as env:
        data = load_shared(open_store(store), env)
        topo = data.topology
        return {
            "indices": _mapping_of(topo.indices.data_ptr()),
            "t_indices": _mapping_of(topo.t_indices.data_ptr()),
            "sum": int(topo.indices.long().sum()) + int(topo.t_indices.long().sum()),
            "dtype": str(topo.indices.dtype),
            "edges": topo.num_edges,
        }


def test_local_ranks_map_one_copy_of_the_topology(tmp_path: Path, cora_store: str, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("NTP_SHARED_DIR", str(shared))  # inherited by the spawned ranks
    ranks = run_on_ranks(shared_topology_worker, 2, cora_store)
    for name in ("indices", "t_indices"):
        mapped = [r[name] for r in ranks]
        assert all(m is not None for m in mapped), f"{name} is a mapped file, not private memory: {mapped}"
        assert mapped[0][0] == mapped[1][0], f"both ranks map the same file (one copy): {mapped}"
        assert str(shared) in mapped[0][1] and mapped[0][1].endswith("(deleted)"), "unlinked once mapped"
    assert ranks[0]["sum"] == ranks[1]["sum"] and ranks[0]["dtype"] == "torch.int32"
    assert list(shared.iterdir()) == [], "nothing is left in the shared folder"


def test_a_single_rank_builds_in_its_own_memory(cora_store: str) -> None:
    from ntp.engine.graph.data import load_rank_data, store_topology
    from storage import open_store

    store = open_store(cora_store)
    data = load_rank_data(store, 1, 0)
    assert _mapping_of(data.topology.indices.data_ptr()) is None
    np.testing.assert_array_equal(data.indices, store.indices())
    assert store_topology(store)["indices"].dtype == np.int32


def test_shared_folder_prefers_tmpfs_with_room_and_obeys_the_override(monkeypatch, tmp_path: Path) -> None:
    from ntp.engine.graph.node_shared import shared_dir

    monkeypatch.delenv("NTP_SHARED_DIR", raising=False)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        assert shared_dir(1) == Path("/dev/shm")
    assert shared_dir(1 << 62) != Path("/dev/shm"), "a topology larger than tmpfs goes to the temp folder"
    monkeypatch.setenv("NTP_SHARED_DIR", str(tmp_path))
    assert shared_dir(1 << 62) == tmp_path
