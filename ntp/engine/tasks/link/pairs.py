"""Scoring pairs of nodes chunk by chunk: the loss of a batch with its gradients, and the scores of an evaluation set.

Why chunks: one ogbl-ddi batch is 131k pairs, so every intermediate of the decoder (the gathered h_u and h_v, their
product, the MLP's hidden layer, the dropout mask) is 131k x 256 floats (134 MB). Made whole, each is a fresh
allocation (page faults) streamed through memory several times; in chunks of a few thousand pairs they stay in cache,
and in training each chunk's forward and backward run before the next chunk, so only one chunk's activations live at
a time. The node embeddings' gradient is accumulated with ``index_add_``: autograd's backward of indexing is
``index_put_`` with accumulation, several times slower on CPU.

Chunks are a fixed number of pairs whatever the world size: every rank forms the products of all pairs of a chunk on
its column slice, and the decoder gives it the scores of its share of that chunk (a balanced contiguous range,
ntp.engine.distributed.partition). Sums then run in the same order for every world size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.partition import Partition
from ntp.engine.tasks.link.model import LINK

#: Pairs per chunk on CPU (8192 x 256 floats: 8 MB, cache-sized) and on accelerators (fewer, larger kernels; their
#: size there is a guess, not yet measured on a GPU).
CPU_CHUNK, DEVICE_CHUNK = 1 << 13, 1 << 17


def pair_chunk(device_type: str) -> int:
    """Pairs per chunk on a ``device_type`` device (the memory plan's too: ntp.engine.tasks.link.memory)."""
    return CPU_CHUNK if device_type == "cpu" else DEVICE_CHUNK


def pair_comm(num_pairs: int, comm: Comm) -> Comm:
    """``comm`` over ``num_pairs`` pairs: its partition gives this rank's share of them."""
    pc = Comm(Partition(num_pairs, comm.world, comm.rank), comm.device, comm.group)
    pc.stats = comm.stats  # one account of the rank's traffic
    return pc


def _ends(h_cols: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return h_cols.index_select(0, pairs[:, 0]), h_cols.index_select(0, pairs[:, 1])


def train_pairs(
    model: torch.nn.Module, h_cols: torch.Tensor, pairs: torch.Tensor, k: int, comm: Comm, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """OGB's loss of a batch whose first ``k`` pairs are positive: this rank's terms summed and divided by ``k``
    (float64 [1]), and the loss's gradient w.r.t. ``h_cols`` (this rank's column slice of every node). The decoder's
    parameters' gradients accumulate in their ``.grad`` (chunk by chunk: call it once per step, after zero_grad)."""
    h = h_cols.detach()
    h_grad = torch.zeros_like(h)
    total = torch.zeros(1, dtype=torch.float64, device=h.device)
    step = pair_chunk(h.device.type)
    for first in range(0, len(pairs), step):
        total += _train_chunk(model, h, h_grad, pairs[first : first + step], first, k, comm, stream)
    return total, h_grad


def _train_chunk(
    model: torch.nn.Module,
    h: torch.Tensor,
    h_grad: torch.Tensor,
    chunk: torch.Tensor,
    first: int,
    k: int,
    comm: Comm,
    stream: int,
) -> torch.Tensor:
    """One chunk's loss (float64 [1]) and its gradients, accumulated into ``h_grad`` and the decoder's ``.grad``; its
    tensors die on return, before the next chunk's are made (ntp.engine.tasks.link.memory counts one chunk)."""
    pc = pair_comm(len(chunk), comm)
    hu, hv = _ends(h, chunk)
    prod = (hu * hv).requires_grad_()
    scores = model.decode(prod, pc, first, stream)
    r0, r1 = pc.part.rows()
    positive = torch.arange(first + r0, first + r1, device=scores.device) < k
    loss = torch.where(positive, -F.logsigmoid(scores), -F.logsigmoid(-scores)).sum() / k
    loss.backward()
    g = prod.grad
    h_grad.index_add_(0, chunk[:, 0], g * hv).index_add_(0, chunk[:, 1], g * hu)
    return loss.detach().double()


def _own_chunk_scores(model: torch.nn.Module, h_cols: torch.Tensor, pairs: torch.Tensor, comm: Comm):
    """``(first pair, pair communicator, scores of this rank's share)`` of every chunk of ``pairs``."""
    step = pair_chunk(h_cols.device.type)
    for first in range(0, len(pairs), step):
        chunk = pairs[first : first + step].to(h_cols.device)
        pc = pair_comm(len(chunk), comm)
        yield first, pc, model.decode(torch.mul(*_ends(h_cols, chunk)), pc, first)


@torch.no_grad()
def score_pairs(model: torch.nn.Module, h_cols: torch.Tensor, pairs: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Scores (logits) of all ``pairs`` [P, 2] on every rank (each rank scores its share of a chunk, then one
    all-gather), in host memory. Every rank must call it with the same pairs."""
    parts = [
        pc.all_gather_rows(own.reshape(-1, 1).contiguous(), LINK)[:, 0].cpu()
        for _, pc, own in _own_chunk_scores(model, h_cols, pairs, comm)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)


@torch.no_grad()
def own_pair_scores(
    model: torch.nn.Module, h_cols: torch.Tensor, pairs: torch.Tensor, comm: Comm
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pair numbers, scores)`` of this rank's share of every chunk of ``pairs``, in host memory, gathered nowhere:
    what each rank writes of a scores export. Every rank must call it with the same pairs."""
    index, scores = [], []
    for first, pc, own in _own_chunk_scores(model, h_cols, pairs, comm):
        index.append(torch.arange(*pc.part.rows()) + first)
        scores.append(own.float().cpu())
    return (
        torch.cat(index) if index else torch.zeros(0, dtype=torch.int64),
        torch.cat(scores) if scores else torch.zeros(0),
    )
