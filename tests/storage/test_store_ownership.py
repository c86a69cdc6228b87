"""Nothing but our own stores and our own dead builds' temp dirs is ever deleted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import zarr
from store_helpers import REPO, quiet

from storage import StoreError, open_store, prepare
from storage.lock import file_lock
from storage.paths import lock_path, temp_prefix


def user_zarr_group(path):
    """Someone else's Zarr group, with a file of theirs beside the arrays."""
    g = zarr.open_group(str(path), mode="w")
    g.attrs["experiment"] = "mine"
    g.create_array("results", shape=(4,), dtype="int32")[:] = np.arange(4)
    (path / "notes.txt").write_text("keep me")


@pytest.mark.parametrize("force", [False, True])
def test_foreign_zarr_group_is_never_replaced(tmp_path, force):
    out = tmp_path / "results.zarr"
    user_zarr_group(out)
    with pytest.raises(StoreError, match="not a graph store.*choose another --out.*remove that path yourself"):
        prepare("synthetic", nodes=100, out=out, progress=quiet, force=force)
    assert (out / "notes.txt").read_text() == "keep me"
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["experiment"] == "mine" and group["results"][:].tolist() == [0, 1, 2, 3]


def test_cli_refuses_a_foreign_zarr_group(tmp_path):
    out = tmp_path / "results.zarr"
    user_zarr_group(out)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "storage.cli",
            "data",
            "prepare",
            "synthetic",
            "--nodes",
            "100",
            "--out",
            str(out),
            "--force",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "not a graph store" in res.stderr and "choose another --out" in res.stderr
    assert (out / "notes.txt").read_text() == "keep me" and (out / "results").is_dir()


def test_empty_directory_and_own_store_are_replaced(tmp_path):
    out = tmp_path / "fresh"
    out.mkdir()
    prepare("synthetic", nodes=200, out=out, progress=quiet)
    prepare("synthetic", nodes=200, seed=3, out=out, progress=quiet, force=True)
    assert open_store(out).meta.source["seed"] == 3


KILLED = (
    "import sys; from storage import prepare; "
    "prepare('synthetic', nodes=150_000, avg_degree=20, features=64, out=sys.argv[1], force=True)"
)


def kill_mid_build(target) -> None:
    """Run a build of `target` in a real process and SIGKILL it while it writes its temp dir."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(target)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:
            if "writing topology" in line:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert temps(target), "the killed build should have left its temp dir"


def temps(target) -> list:
    return [p for p in target.parent.iterdir() if p.name.startswith(temp_prefix(target))]


def test_killed_rebuild_is_swept_when_the_store_is_reused(tmp_path):
    target = tmp_path / "stores" / "s"
    prepare("synthetic", nodes=300, out=target, progress=quiet)
    kill_mid_build(target)  # a --force rebuild with other options dies half way
    assert prepare("synthetic", nodes=300, out=target, progress=quiet) == target  # reused, not rebuilt
    assert not temps(target)
    open_store(target).verify()


def test_killed_build_is_swept_by_a_build_beside_it(tmp_path):
    dead, other = tmp_path / "stores" / "dead", tmp_path / "stores" / "other"
    kill_mid_build(dead)
    prepare("synthetic", nodes=300, out=other, progress=quiet)
    assert not temps(dead) and not dead.exists()
    assert sorted(p.name for p in dead.parent.iterdir()) == [".dead.lock", ".other.lock", "other"]


def test_live_builds_and_lookalikes_are_left_alone(tmp_path):
    parent = tmp_path / "stores"
    target, busy = parent / "s", parent / "busy"
    parent.mkdir()
    lookalike = parent / f"{temp_prefix(target)}1-deadbeef"  # our name, someone else's content
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("keep me")
    running = parent / f"{temp_prefix(busy)}1-cafef00d"  # a build that still holds its lock
    running.mkdir()
    (running / "spill-src.bin").write_bytes(b"\0" * 8)
    with file_lock(lock_path(busy)):
        prepare("synthetic", nodes=300, out=target, progress=quiet)
        prepare("synthetic", nodes=300, seed=1, out=target, progress=quiet, force=True)
    assert (lookalike / "notes.txt").read_text() == "keep me"
    assert (running / "spill-src.bin").is_file()
