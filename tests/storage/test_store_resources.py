"""Sizes must be sizes, and a graph that cannot fit is refused before anything is generated."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from store_helpers import REPO, quiet

from storage import StoreError, open_store, prepare
from storage.csr import Preprocessing
from storage.resources import PADDING, available_memory, estimate
from storage.sources.synthetic import SyntheticSpec, synthetic_source


@pytest.mark.parametrize(
    "kw",
    [
        dict(nodes=0),
        dict(nodes=-5),
        dict(features=0),
        dict(classes=0),
        dict(avg_degree=-1.0),
        dict(avg_degree=float("nan")),
    ],
)
def test_non_positive_sizes_are_errors(tmp_path, kw):
    flag = "--" + next(iter(kw)).replace("_", "-")
    with pytest.raises(StoreError, match=rf"{flag} .* not a valid .*Fix:"):
        prepare("synthetic", out=tmp_path / "s", progress=quiet, **kw)
    assert not (tmp_path / "s").exists()


def test_edgelist_nodes_zero_is_an_error(tmp_path):
    (tmp_path / "e.csv").write_text("src,dst\n0,1\n")
    with pytest.raises(StoreError, match=r"--nodes 0 is not a valid size"):
        prepare("toy", edges=tmp_path / "e.csv", nodes=0, data_dir=tmp_path, progress=quiet)


def limit_memory() -> None:
    """A test must never exhaust the machine, whatever the code under test does."""
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "2999999999", "--avg-degree", "1000", "--features", "4096"],
        ["--nodes", "2000000000", "--avg-degree", "50", "--features", "1"],
    ],
)
def test_graph_that_cannot_fit_is_refused_up_front(tmp_path, args):
    out = tmp_path / "huge"
    res = subprocess.run(
        [sys.executable, "-m", "storage.cli", "data", "prepare", "synthetic", *args, "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_memory,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    error = res.stderr.strip().splitlines()[-1]
    assert "GiB of" in error and ("disk" in error or "memory" in error) and "Fix:" in error, error
    assert "streaming edges" not in res.stderr  # refused before generating
    assert sorted(p.name for p in tmp_path.iterdir()) == [".huge.lock"]


def test_estimate_matches_a_real_store(tmp_path):
    spec = SyntheticSpec(nodes=100_000, avg_degree=10, features=16, classes=5)
    est = estimate(synthetic_source(spec), Preprocessing(symmetrize=True), "float32")
    path = prepare(
        "synthetic",
        nodes=100_000,
        avg_degree=10,
        features=16,
        classes=5,
        symmetrize=True,
        out=tmp_path / "s",
        progress=quiet,
    )
    actual = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert actual <= est.disk_bytes <= 1.3 * actual + PADDING, (est.disk_bytes, actual)
    assert open_store(path).meta.num_nodes == 100_000


def test_available_memory_is_known_here():
    memory = available_memory()
    assert memory is not None and 0 < memory <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
