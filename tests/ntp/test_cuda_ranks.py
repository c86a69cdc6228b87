"""Several CUDA ranks on one GPU (the lent machines have one): tensor parallelism's multi-rank GPU paths (a streamed
column slice beside an NN stage on the GPU, the NN stage streamed in row blocks, the overlapped chunk loops) train
as one CPU process does. The ranks share the GPU through host-staged gloo collectives, a testing mode
(ntp.engine.distributed.dist.SHARED_GPU_ENV) that nothing chooses by default. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.ntp.exactness_worker import trace_all, trace_all_on_shared_gpu
from tests.ntp.graphs import random_graph
from tests.ntp.spawn import run_on_ranks
from tests.ntp.test_exactness import assert_close_to_scale

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run where one is)"),
]

EPOCHS = 3
BASE = dict(hidden=16, nn_layers=2, prop_steps=2, dropout=0.5, lr=0.05, seed=3)
CONFIGS = [
    dict(BASE, model="gcn", arch="coupled"),
    dict(BASE, model="sage", arch="coupled", nn_device="stream", nn_block_rows=40),
    dict(BASE, model="gcn", arch="coupled", offload="all", memory_budget="400KB", nn_device="device"),
    dict(BASE, model="gcn", arch="coupled", offload="all", memory_budget="400KB", nn_device="stream", nn_block_rows=40),
    dict(BASE, model="gcn", arch="decoupled", overlap=True, chunk_rows=30),
    dict(BASE, model="gat", arch="coupled", heads=2),
]
GRAPH = random_graph(directed=True, seed=1)


@pytest.mark.parametrize("world", [2, 3])
def test_cuda_ranks_sharing_a_gpu_train_as_one_cpu_process(world: int) -> None:
    single = [dict({k: v for k, v in c.items() if k != "overlap"}, mode="single") for c in CONFIGS]  # tp's option
    reference = run_on_ranks(trace_all, 1, single, GRAPH, EPOCHS)[0]
    per_rank = run_on_ranks(
        trace_all_on_shared_gpu, world, [dict(c, mode="tp") for c in CONFIGS], GRAPH, EPOCHS, timeout=300
    )
    for i, cfg in enumerate(CONFIGS):
        where = f"{cfg} on {world} CUDA ranks"
        for rank in per_rank:
            torch.testing.assert_close(
                torch.tensor(rank[i]["losses"]),
                torch.tensor(reference[i]["losses"]),
                rtol=1e-4,
                atol=1e-5,
                msg=lambda m: f"losses differ: {where}\n{m}",
            )
            for name, g in reference[i]["grads"].items():
                assert_close_to_scale(rank[i]["grads"][name], g, f"gradient of {name}: {where}", rtol=1e-4)
        assert_close_to_scale(
            torch.cat([r[i]["logits"] for r in per_rank]),
            reference[i]["logits"],
            f"final predictions: {where}",
            rtol=1e-4,
        )
