"""Crash safety, concurrent builders and idempotence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from store_helpers import REPO, quiet

from storage import StoreError, open_store, prepare
from storage.paths import temp_prefix

BUILD = (
    "import sys; from storage import prepare; "
    "print(prepare('synthetic', nodes=int(sys.argv[2]), avg_degree=20, features=64, out=sys.argv[1]))"
)


def start_build(target, nodes: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", BUILD, str(target), str(nodes)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("marker", ["edges read", "scattering", "writing topology", "writing features"])
def test_kill_during_build_leaves_no_store(marker, tmp_path):
    target = tmp_path / "stores" / "big"
    proc = start_build(target, 150_000)
    try:
        for line in proc.stderr:
            if marker in line:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()
    leftovers = [p for p in target.parent.iterdir() if p.name.startswith(temp_prefix(target))]
    assert leftovers, "the killed build should have been writing into a temp dir"
    with pytest.raises(StoreError):
        open_store(leftovers[0])
    # A later build succeeds and sweeps the dead build's temp dir away.
    prepare("synthetic", nodes=2_000, avg_degree=5, features=8, out=target, progress=quiet)
    open_store(target).verify()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(temp_prefix(target))]


def test_concurrent_builders_end_with_one_store(tmp_path):
    target = tmp_path / "stores" / "shared"
    procs = [start_build(target, 100_000) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert {out.strip().splitlines()[-1] for out, _ in results} == {str(target)}
    built = sum(
        "store ready" in err and "another process" not in err and "already built" not in err for _, err in results
    )
    assert built == 1, [err for _, err in results]
    store = open_store(target)
    store.verify()
    assert sorted(p.name for p in target.parent.iterdir()) == [".shared.lock", "shared"]


def test_idempotent_and_option_sensitive(tmp_path):
    kw = dict(nodes=500, avg_degree=4, features=8, data_dir=tmp_path, progress=quiet)
    a = prepare("synthetic", **kw)
    mtime = (a / "zarr.json").stat().st_mtime_ns
    assert prepare("synthetic", **kw) == a
    assert (a / "zarr.json").stat().st_mtime_ns == mtime  # not rebuilt
    b = prepare("synthetic", symmetrize=True, **kw)
    c = prepare("synthetic", seed=1, **kw)
    d = prepare("synthetic", feature_dtype="float16", **kw)
    assert len({a, b, c, d}) == 4 and all(p.parent == tmp_path / "stores" for p in (a, b, c, d))
    assert prepare("synthetic", force=True, **kw) == a
    assert (a / "zarr.json").stat().st_mtime_ns != mtime


def test_out_with_other_options_needs_force(tmp_path):
    out = tmp_path / "mine"
    prepare("synthetic", nodes=300, out=out, progress=quiet)
    with pytest.raises(StoreError, match="other inputs or options.*--force"):
        prepare("synthetic", nodes=300, seed=5, out=out, progress=quiet)
    prepare("synthetic", nodes=300, seed=5, out=out, progress=quiet, force=True)
    assert open_store(out).meta.source["seed"] == 5


def test_damaged_store_is_rebuilt(tmp_path):
    out = tmp_path / "s"
    prepare("synthetic", nodes=300, out=out, progress=quiet)
    (out / "indices" / "c" / "0").unlink()
    with pytest.raises(StoreError):
        open_store(out)
    assert prepare("synthetic", nodes=300, out=out, progress=quiet) == out
    open_store(out).verify()


def test_foreign_directory_is_never_replaced(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("do not delete")
    for force in (False, True):
        with pytest.raises(StoreError, match="not a graph store"):
            prepare("synthetic", nodes=100, out=out, progress=quiet, force=force)
    assert (out / "thesis.txt").read_text() == "do not delete"
