"""Data parallel's halo plan (its exactness against single process is in test_exactness.py)."""

from __future__ import annotations

import torch

from ntp.engine.graph.operators import CSR
from ntp.engine.parallel.data_parallel import halo_plan
from tests.ntp.graphs import random_graph


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
