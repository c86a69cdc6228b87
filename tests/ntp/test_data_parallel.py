"""Data parallel (vertex partition + halo exchange) == single process, as tensor parallelism: world sizes 1-4."""
from __future__ import annotations

import pytest
import torch

from ntp.aggregate import CSR
from ntp.data_parallel import halo_plan
from ntp.metrics import HALO
from tests.ntp.exactness_worker import trace_all
from tests.ntp.graphs import random_graph
from tests.ntp.spawn import run_on_ranks
from tests.ntp.test_exactness import CONFIGS, EPOCHS, GRAPHS, _name, assert_close_to_scale


@pytest.fixture(scope="module")
def reference() -> dict:
    return {g: trace_all([dict(c, mode="single") for c in CONFIGS], graph, EPOCHS) for g, graph in GRAPHS.items()}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_data_parallel_equals_single(world: int, graph_name: str, reference: dict) -> None:
    per_rank = run_on_ranks(trace_all, world, [dict(c, mode="data") for c in CONFIGS], GRAPHS[graph_name], EPOCHS)
    for i, cfg in enumerate(CONFIGS):
        ref = reference[graph_name][i]
        ranks = [r[i] for r in per_rank]
        where = f"data-parallel {_name(cfg)} on {graph_name} graph, world {world}"
        for rank_result in ranks:
            torch.testing.assert_close(torch.tensor(rank_result["losses"]), torch.tensor(ref["losses"]),
                                       rtol=1e-5, atol=1e-6, msg=lambda m: f"losses differ: {where}\n{m}")
            for name, g in ref["grads"].items():
                assert_close_to_scale(rank_result["grads"][name], g, f"gradient of {name}: {where}")
            assert ("split" in rank_result["bytes"]) is False, f"data mode must not split/gather: {where}"
            if world > 1:
                assert rank_result["bytes"].get(HALO, 0) > 0, f"no halo bytes counted: {where}"
        assert_close_to_scale(torch.cat([r["logits"] for r in ranks]), ref["logits"], f"final predictions: {where}")


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
