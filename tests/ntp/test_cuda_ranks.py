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


#: 100k rows on 2 ranks, 128 columns wide: a rank's rows are 25.6 MB a matrix; streamed in blocks of 1000 rows, the
#: column slice in blocks of about 6 of its 64 columns under a 14 MB budget (ntp.engine.memory.offload.offloaded_layout;
#: 3 before the products took the room the NN block leaves them: ntp.engine.memory.phases)
WIDE = dict(mode="tp", model="gcn", arch="coupled", hidden=128, dropout=0.5, epochs=2, seed=1)
STREAMED_WIDE = dict(WIDE, nn_device="stream", nn_block_rows=1000, offload="all", memory_budget="14MB")


def _streamed_step_peak() -> dict:
    """A streamed rank's device peak over a step (above what lived before it), beside its rows' bytes."""
    import os

    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import SHARED_GPU_ENV, distributed
    from ntp.engine.train.setup import setup
    from tests.ntp.graphs import loader
    from tests.ntp.test_cuda_stream import step_device_peak

    os.environ[SHARED_GPU_ENV] = "1"
    graph = random_graph(n=100_000, d=128, classes=8, avg_degree=10, seed=5)
    with distributed(120, "cuda") as env:
        job = setup(TrainConfig(**STREAMED_WIDE), env, loader(graph))
        return {
            "peak": step_device_peak(job),
            "rows": job.comm.part.num_rows() * WIDE["hidden"] * 4,
            "column_block": job.ctx.column_block,
            "budget": job.cfg.memory_budget_bytes,
        }


def test_streamed_ranks_exchange_their_rows_in_passes_never_whole_on_the_gpu() -> None:
    """Two streamed CUDA ranks with the column slice streamed too (--offload all): split and gather move the rows a
    block at a time (ntp.engine.distributed.collectives.Comm.rows_to_cols_in_passes), so a step's device peak stays
    under the budget and under one matrix of a rank's rows; an exchange of whole rows holds three such matrices
    (the rows on the device, the send and receive buffers), which the plan never counted."""
    for rank, out in enumerate(run_on_ranks(_streamed_step_peak, 2, timeout=300)):
        print(
            f"streamed step on rank {rank}: {out['peak'] / 1e6:.1f} MB, a matrix of its rows {out['rows'] / 1e6:.1f} MB"
        )
        assert 0 < out["column_block"] < 64, out
        assert out["peak"] <= out["budget"], out
        assert out["peak"] < out["rows"], out
