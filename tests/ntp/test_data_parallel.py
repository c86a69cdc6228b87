"""Data parallel's halo plan (its exactness against single process is in test_exactness.py); it takes no chunk
plan and its records claim none."""

from __future__ import annotations

import json

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.graph.operators import CSR
from ntp.engine.parallel.data_parallel import DataParallelContext, halo_plan
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError
from ntp.run.cli import main as ntp_main
from tests.ntp.graphs import loader, random_graph


def test_halo_plan_send_matches_receive() -> None:
    """What rank q receives from rank r is exactly what rank r sends to q, in the same order."""
    g = random_graph(n=50, directed=True, seed=7)
    src, dst = torch.from_numpy(g["edge_index"][0]), torch.from_numpy(g["edge_index"][1])
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(51, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=50), 0, out=indptr[1:])
    csr = CSR(indptr, src[order], 50)
    bounds = [0, 13, 26, 38, 50]
    plans = [halo_plan(csr, bounds, r) for r in range(4)]
    for q in range(4):
        offsets = [0] + torch.cumsum(torch.tensor(plans[q].recv_counts), 0).tolist()
        for r in range(4):
            got = plans[q].halo_ids[offsets[r] : offsets[r + 1]]
            so = [0] + torch.cumsum(torch.tensor(plans[r].send_counts), 0).tolist()
            sent = plans[r].send_index[so[q] : so[q + 1]] + bounds[r]
            assert torch.equal(got, sent), f"rank {r} -> rank {q}"
            e0, e1 = int(indptr[bounds[q]]), int(indptr[bounds[q + 1]])
            s = csr.indices[e0:e1]
            want = torch.unique(s[(s >= bounds[r]) & (s < bounds[r + 1])]) if r != q else s[:0]
            assert torch.equal(got, want)


def test_a_budget_is_refused_before_any_rank_and_records_claim_no_chunks(tmp_path, capsys) -> None:
    """Data parallelism aggregates a rank's rows in one block: ``--memory-budget`` and ``--chunk-rows`` are refused
    with the fix (the CLI before any rank starts, no traceback), and a data-parallel rank records one chunk even
    where a chunk size reaches its context (as a GPU's default budget would)."""
    for given in (dict(memory_budget="1KB"), dict(chunk_rows=10)):
        with pytest.raises(ConfigError, match=r"--mode data.* use --mode tp \(planned and chunked to fit\)"):
            TrainConfig(mode="data", **given)
    argv = ["train", "--store", str(tmp_path / "missing"), "--mode", "data", "--nproc", "2", "--memory-budget", "1KB"]
    assert ntp_main(argv) == 2
    err = capsys.readouterr().err
    assert "--memory-budget cuts tensor parallelism's aggregation" in err and "Traceback" not in err
    results = tmp_path / "results.jsonl"
    cfg = TrainConfig(mode="data", epochs=2, hidden=8, results=str(results))
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None), loader(random_graph(n=60, d=5, classes=3, seed=1)))
    assert isinstance(job.ctx, DataParallelContext)
    job.ctx.chunk_rows = 7  # a tensor-parallel context would cut 60 rows into 9 chunks
    fit(job)
    epochs = [r for r in map(json.loads, results.read_text().splitlines()) if "workers" in r]
    assert len(epochs) == 2 and all(w["chunks"] == 1 for r in epochs for w in r["workers"])
