"""Link prediction's model: a tensor-parallel encoder (any model of ntp.engine.nn.models), learnable node embeddings
column-sliced across ranks when the graph has no features, and a decoder that scores pairs of nodes.

Decoders work in the graph layout, where every rank holds all rows of its column slice of the embeddings ``H``, on
the products ``H[u, C_r] * H[v, C_r]`` of a chunk of pairs (ntp.engine.tasks.link.pairs forms them, the same work on
every rank):
- dot: each rank sums its products' columns (partial dot products), and one reduce-scatter sums the partials,
  leaving each rank the scores of its share of the chunk's pairs;
- mlp (OGB's LinkPredictor): one all-to-all over the pairs (the split/gather of the pairs) gives each rank complete
  rows for its share, and the MLP runs there.
A rank's share of a chunk is a contiguous, balanced range (ntp.engine.distributed.partition), so the loss of every pair is
computed once; its replicated parameters' gradients are summed over ranks. Dropout masks depend on (seed, step,
layer, pair index) only, never on the number of ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from ntp.config import TrainConfig
from ntp.engine.distributed.collectives import Comm, gather, reduce_scatter_rows
from ntp.engine.distributed.partition import Partition
from ntp.engine.kernels import packed, streams
from ntp.engine.kernels.dropout import drop
from ntp.engine.kernels.linear import Linear
from ntp.engine.nn.embedding import SlicedEmbedding
from ntp.engine.nn.models import build_model
from ntp.engine.parallel.context import GraphContext

#: Communication kind of the pair exchanges (in the workers' byte counts).
LINK = "link"


def _relu_pair_dropout(x: torch.Tensor, p: float, rows: tuple[int, int], stream: int) -> torch.Tensor:
    """ReLU, then dropout of the pairs ``rows`` (their indices in the batch): the mask depends on them, not on the
    ranks."""
    if p == 0.0:
        return packed.relu(x)
    return drop(x, p, stream, rows[0], relu=True)


class DotDecoder(nn.Module):
    """score(u, v) = h_u . h_v."""

    def forward(self, prod: torch.Tensor, pc: Comm, first: int, stream: int) -> torch.Tensor:
        return reduce_scatter_rows(prod.sum(dim=1, keepdim=True), pc, LINK)[:, 0]


class MLPDecoder(nn.Module):
    """OGB's LinkPredictor: x = h_u * h_v; (Linear -> ReLU -> dropout) repeated; Linear to one score."""

    def __init__(self, width: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [width] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.width, self.dropout = width, dropout

    def forward(self, prod: torch.Tensor, pc: Comm, first: int, stream: int) -> torch.Tensor:
        x = gather(prod, pc, self.width, LINK)  # this rank's pairs, all columns
        r0, r1 = pc.part.rows()
        p = self.dropout if self.training else 0.0
        for i, lin in enumerate(self.lins[:-1]):
            x = _relu_pair_dropout(lin(x), p, (first + r0, first + r1), streams.with_layer(stream, i))
        return self.lins[-1](x)[:, 0]


def build_decoder(cfg: TrainConfig) -> nn.Module:
    return MLPDecoder(cfg.hidden, cfg.hidden, cfg.decoder_layers, cfg.dropout) if cfg.decoder == "mlp" else DotDecoder()


def replicated_size(cfg: TrainConfig, feature_dim: int) -> int:
    """Elements of the parameters every rank holds whole (:meth:`LinkModel.replicated`), counted without making the
    node embeddings."""
    modules = (build_model(cfg, feature_dim or cfg.hidden, cfg.hidden), build_decoder(cfg))
    return sum(p.numel() for m in modules for p in m.parameters())


class LinkModel(nn.Module):
    """Encoder (with sliced embeddings when there are no features) and decoder."""

    def __init__(self, cfg: TrainConfig, num_nodes: int, feature_dim: int, part: Partition) -> None:
        super().__init__()
        self.encoder = build_model(cfg, feature_dim or cfg.hidden, cfg.hidden)  # seeded from cfg.seed
        self.embedding = SlicedEmbedding(num_nodes, cfg.hidden, part, cfg.seed) if feature_dim == 0 else None
        torch.manual_seed(cfg.seed + 1)
        self.decoder = build_decoder(cfg)

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        """Node embeddings of this rank's rows (row layout)."""
        return self.encoder(self.embedding(ctx) if self.embedding is not None else x, ctx)

    def replicated(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole (their gradients are summed over ranks): all but the embeddings."""
        return list(self.encoder.parameters()) + list(self.decoder.parameters())

    def decode(self, prod: torch.Tensor, pc: Comm, first: int = 0, stream: int = 0) -> torch.Tensor:
        """Scores (logits) of this rank's share ``pc.part.rows()`` of a chunk of pairs, from their products
        ``h_u * h_v`` on this rank's column slice [pairs, columns]; ``first``: the chunk's first pair in its batch
        (the dropout masks' rows). ntp.engine.tasks.link.pairs forms the products and runs the chunks."""
        return self.decoder(prod, pc, first, stream)
