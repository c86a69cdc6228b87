"""Collectives: split/gather values and backward per rank, and bytes equal to the cost model, balanced."""

from __future__ import annotations

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.collectives import Comm, gather, split
from ntp.engine.distributed.cost import coupled_bytes, decoupled_bytes
from ntp.engine.distributed.dist import distributed
from ntp.engine.distributed.partition import Partition, ceil_div
from ntp.engine.train.loop import train_step
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader, random_graph
from tests.ntp.spawn import run_on_ranks

N, D = 10, 7


def _full(seed: int) -> torch.Tensor:
    return torch.randn(N, D, generator=torch.Generator().manual_seed(seed))


def split_gather_worker() -> dict:
    with distributed(30, "cpu") as env:
        comm = Comm(Partition(N, env.world, env.rank), env.device)
        r0, r1 = comm.part.rows()
        c0, c1 = comm.part.cols(D)
        x = _full(0)[r0:r1].clone().requires_grad_()
        cols = split(x, comm)
        cols.backward(_full(1)[:, c0:c1])  # upstream gradient in the column layout
        y = _full(2)[:, c0:c1].clone().requires_grad_()
        rows = gather(y, comm, D)
        rows.backward(_full(3)[r0:r1])
        return {
            "cols": cols.detach(),
            "x_grad": x.grad,
            "rows": rows.detach(),
            "y_grad": y.grad,
            "bounds": (r0, r1, c0, c1),
        }


@pytest.mark.parametrize("world", [2, 3, 4])
def test_split_and_gather_move_the_right_blocks_both_ways(world: int) -> None:
    for rank, out in enumerate(run_on_ranks(split_gather_worker, world)):
        r0, r1, c0, c1 = out["bounds"]
        assert torch.equal(out["cols"], _full(0)[:, c0:c1]), f"split, rank {rank}"
        assert torch.equal(out["x_grad"], _full(1)[r0:r1]), f"split backward = gather, rank {rank}"
        assert torch.equal(out["rows"], _full(2)[r0:r1]), f"gather, rank {rank}"
        assert torch.equal(out["y_grad"], _full(3)[:, c0:c1]), f"gather backward = split, rank {rank}"


def passes_worker(n: int, width: int, blocks: list[int]) -> dict:
    """Split and gather in passes of each of ``blocks`` rows, values and gradients, and the bytes each moved."""
    with distributed(30, "cpu") as env:
        comm = Comm(Partition(n, env.world, env.rank), env.device)
        r0, r1 = comm.part.rows()
        c0, c1 = comm.part.cols(width)
        full = lambda seed: torch.randn(n, width, generator=torch.Generator().manual_seed(seed))  # noqa: E731
        out = {}
        for block in [0, *blocks]:  # 0: one pass, the reference
            comm.stats.reset()
            x = full(0)[r0:r1].clone().requires_grad_()
            cols = split(x, comm, block_rows=block, to=env.device)
            cols.backward(full(1)[:, c0:c1])
            y = full(2)[:, c0:c1].clone().requires_grad_()
            rows = gather(y, comm, width, block_rows=block, to=env.device)
            rows.backward(full(3)[r0:r1])
            stats = comm.stats
            out[block] = {
                "values": [cols.detach(), x.grad, rows.detach(), y.grad],
                "bytes": (dict(stats.bytes_sent), dict(stats.bytes_recv)),
                "calls": dict(stats.calls),
            }
        return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_split_and_gather_in_passes_move_what_one_pass_moves(world: int) -> None:
    """An exchange of rows kept in host memory (--nn-device stream) runs in passes of a block of rows: the slice,
    the rows and both backwards equal one pass's exactly, for blocks of one row, of a size that divides nothing, and
    larger than a rank's rows, on 23 rows (a rank's block uneven) of 10 columns (uneven too); the bytes are one
    pass's, and each pass is one all-to-all (on one rank: a copy, no collective)."""
    n, width, blocks = 23, 10, [1, 4, 100]
    for rank, out in enumerate(run_on_ranks(passes_worker, world, n, width, blocks)):
        reference = out[0]
        for block in blocks:
            names = ("split", "its backward", "gather", "its backward")
            for name, got, want in zip(names, out[block]["values"], reference["values"]):
                assert torch.equal(got, want), f"{name} in passes of {block} rows, rank {rank}"
            assert out[block]["bytes"] == reference["bytes"], f"passes of {block} rows, rank {rank}"
            passes = ceil_div(ceil_div(n, world), block)
            assert out[block]["calls"] == {k: passes * v for k, v in reference["calls"].items()}


REPEATS = 5


def exchange_peaks_worker(n: int, width: int, block: int = 0) -> dict:
    """The least peak of live bytes over a few repeats of a split and of a gather, in one pass or in passes of
    ``block`` rows, beside the size of a send buffer (the whole padded matrix, or a pass's) and of the result."""
    from tests.ntp.live_bytes import LiveBytes

    with distributed(30, "cpu") as env:
        comm = Comm(Partition(n, env.world, env.rank), env.device)
        c0, c1 = comm.part.cols(width)
        x, y = torch.randn(comm.part.num_rows(), width), torch.randn(n, c1 - c0)
        if block:
            split_, gather_ = (
                lambda: comm.rows_to_cols_in_passes(x, block, env.device),
                lambda: comm.cols_to_rows_in_passes(y, width, block, env.device),
            )
        else:
            split_, gather_ = lambda: comm.rows_to_cols(x), lambda: comm.cols_to_rows(y, width)
        peaks = {}
        for name, exchange in (("split", split_), ("gather", gather_)):
            for _ in range(REPEATS):
                live = LiveBytes()
                with live:
                    exchange()
                peaks[name] = min(peaks.get(name, live.peak), live.peak)
        rows = block or comm.part.padded_rows
        return {
            "peaks": peaks,
            "block": env.world * rows * comm.part.padded_cols(width) * 4,  # a padded send buffer
            "result": 4 * max(n * (c1 - c0), comm.part.num_rows() * width),
        }


@pytest.mark.parametrize("world", [2, 3])
def test_an_exchange_in_passes_holds_its_result_and_a_pass(world: int) -> None:
    """In passes, an exchange holds its result and a pass's send and receive buffers, and at times the previous
    pass's, which gloo's worker thread may hold a moment after the collective returns (seen under load in CI:
    four buffers), not two whole matrices (a one-pass exchange here: twice the result): what lets a streamed rank's device hold a pass, not the rows
    (ntp.engine.memory.parts.EXCHANGE_COPIES counts four such buffers)."""
    for out in run_on_ranks(exchange_peaks_worker, world, 1_001, 37, 50):
        for name, peak in out["peaks"].items():
            assert peak <= out["result"] + 4 * out["block"], f"{name}: {peak} bytes live, {out}"


@pytest.mark.parametrize("world", [2, 3])
def test_an_exchange_holds_two_buffers_at_most(world: int) -> None:
    """A split or gather sends a padded buffer and receives one as large, then lays the result out: the send
    buffer is freed first, so no more than two such matrices live at once (three were: with the loss fused into the
    last streamed segment, tests/ntp/test_row_stream.py, a two-rank CPU step's peak fell by a fifth). The least of a
    few repeats: gloo's worker thread sometimes still holds the send buffer a moment after the collective returns."""
    for out in run_on_ranks(exchange_peaks_worker, world, 1_001, 37):
        for name, peak in out["peaks"].items():
            assert peak <= 2 * out["block"], f"{name}: {peak} bytes live, {out['block']} a buffer"


GRAPH = random_graph(n=101, d=13, classes=5, seed=4)


def bytes_worker(configs: list[dict]) -> list[dict]:
    with distributed(30, "cpu") as env:
        out = []
        for c in configs:
            job = setup(TrainConfig(**c), env, loader(GRAPH))
            job.comm.stats.reset()
            train_step(job, 0)
            out.append({k: dict(getattr(job.comm.stats, k)) for k in ("bytes_sent", "bytes_recv", "calls")})
        return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_bytes_equal_the_cost_model_and_are_balanced(world: int) -> None:
    base = dict(mode="tp", hidden=11, dropout=0.0)
    configs = [
        dict(base, model="gcn", arch="decoupled", nn_layers=3, prop_steps=4),
        dict(base, model="gcn", arch="coupled", nn_layers=3),
        dict(base, model="gcn", arch="coupled", nn_layers=3, hidden=20),
    ]  # wider than the 13 features
    per_rank = run_on_ranks(bytes_worker, world, configs)
    n, features, classes = 101, 13, 5
    expected = [
        decoupled_bytes(n, classes, world),
        coupled_bytes(n, [features, 11, 11, classes], world),
        coupled_bytes(n, [features, 20, 20, classes], world),
    ]
    for i, exp in enumerate(expected):
        moved = [r[i]["bytes_sent"]["split"] + r[i]["bytes_sent"]["gather"] for r in per_rank]
        received = [r[i]["bytes_recv"]["split"] + r[i]["bytes_recv"]["gather"] for r in per_rank]
        assert moved == [exp] * world, f"config {configs[i]['arch']}: {moved} != cost model {exp}"
        assert received == moved
        assert max(moved) / min(moved) == 1.0
    calls = per_rank[0][0]["calls"]
    assert calls["split"] + calls["gather"] == 4, "decoupled training makes exactly 4 all-to-alls per epoch"
    assert expected[0] < expected[1], "decoupled moves fewer bytes than naive tensor parallelism"
    assert per_rank[0][2]["calls"]["split"] + per_rank[0][2]["calls"]["gather"] == 10, (
        "the first layer propagates the 13 features, not its 20 outputs, and nothing flows back into them"
    )
