"""Link prediction's model: a tensor-parallel encoder (any model of ntp.engine.models), learnable node embeddings
column-sliced across ranks when the graph has no features, and a decoder that scores pairs of nodes.

Decoders work in the graph layout, where every rank holds all rows of its column slice of the embeddings ``H``, on
the products ``H[u, C_r] * H[v, C_r]`` of a chunk of pairs (ntp.engine.link_pairs forms them, the same work on
every rank):
- dot: each rank sums its products' columns (partial dot products), and one reduce-scatter sums the partials,
  leaving each rank the scores of its share of the chunk's pairs;
- mlp (OGB's LinkPredictor): one all-to-all over the pairs (the split/gather of the pairs) gives each rank complete
  rows for its share, and the MLP runs there.
A rank's share of a chunk is a contiguous, balanced range (ntp.engine.partition), so the loss of every pair is
computed once; its replicated parameters' gradients are summed over ranks. Dropout masks depend on (seed, step,
layer, pair index) only, never on the number of ranks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ntp.config import TrainConfig
from ntp.engine.collectives import Comm, gather, reduce_scatter_rows
from ntp.engine.context import GraphContext
from ntp.engine.layers import keep_mask
from ntp.engine.models import build_model
from ntp.engine.partition import Partition

#: Communication kind of the pair exchanges (in the workers' byte counts).
LINK = "link"
#: Embedding initialisation draws tiles of this many rows, each from its own seed (any world size: same matrix).
INIT_TILE_ROWS = 4096


class SlicedEmbedding(nn.Module):
    """Learnable embeddings [n, width] of which this rank holds all n rows of its column slice (the graph layout);
    ``forward`` gathers them into the row layout, the encoder's input. Xavier-uniform initialisation (as OGB's
    examples) drawn tile by tile from the seed, so every world size starts from the same matrix.

    Its state dict holds the whole matrix: :meth:`snapshot` (a collective) gathers it on every rank, and loading a
    whole matrix keeps this rank's slice."""

    def __init__(self, num_nodes: int, width: int, part: Partition, seed: int) -> None:
        super().__init__()
        self.num_nodes, self.width, self.world = num_nodes, width, part.world
        self.c0, self.c1 = part.cols(width)
        bound = math.sqrt(6.0 / (num_nodes + width))
        weight = torch.empty(num_nodes, self.c1 - self.c0)
        gen = torch.Generator()
        for t0 in range(0, num_nodes, INIT_TILE_ROWS):
            gen.manual_seed((seed * 1_000_003 + t0 // INIT_TILE_ROWS) * 7919 + 17)
            tile = torch.rand(min(INIT_TILE_ROWS, num_nodes - t0), width, generator=gen)
            weight[t0 : t0 + len(tile)] = (2 * tile[:, self.c0 : self.c1] - 1) * bound
        self.weight = nn.Parameter(weight)
        self.full: torch.Tensor | None = None  #: the whole matrix as of the last snapshot (several ranks)

    def forward(self, ctx: GraphContext) -> torch.Tensor:
        return ctx.from_graph(self.weight, self.width)

    @torch.no_grad()
    def snapshot(self, ctx: GraphContext) -> None:
        """Gather the whole matrix on every rank (for the state dict); every rank must call it."""
        if self.world > 1:
            rows = ctx.from_graph(self.weight.detach(), self.width)
            self.full = ctx.comm.all_gather_rows(rows.to(ctx.device).contiguous(), LINK).cpu()

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001 (torch's signature)
        if self.world == 1:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.full is None:
            raise RuntimeError("the embeddings are sliced over ranks and no snapshot was gathered: call "
                               "SlicedEmbedding.snapshot on every rank first")
        destination[prefix + "weight"] = self.full.clone()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001
        key = prefix + "weight"
        if key in state_dict and state_dict[key].shape == (self.num_nodes, self.width) and self.world > 1:
            state_dict[key] = state_dict[key][:, self.c0 : self.c1]
        return super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _pair_dropout(x: torch.Tensor, p: float, rows: tuple[int, int], stream: int) -> torch.Tensor:
    """Dropout of the pairs ``rows`` (their indices in the batch): the mask depends on them, not on the ranks."""
    scale = keep_mask(rows, x.shape[1], p, stream, x.device).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * scale


class DotDecoder(nn.Module):
    """score(u, v) = h_u . h_v."""

    def forward(self, prod: torch.Tensor, pc: Comm, first: int, stream: int) -> torch.Tensor:
        return reduce_scatter_rows(prod.sum(dim=1, keepdim=True), pc, LINK)[:, 0]


class MLPDecoder(nn.Module):
    """OGB's LinkPredictor: x = h_u * h_v; (Linear -> ReLU -> dropout) repeated; Linear to one score."""

    def __init__(self, width: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [width] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.width, self.dropout = width, dropout

    def forward(self, prod: torch.Tensor, pc: Comm, first: int, stream: int) -> torch.Tensor:
        x = gather(prod, pc, self.width, LINK)  # this rank's pairs, all columns
        r0, r1 = pc.part.rows()
        for i, lin in enumerate(self.lins[:-1]):
            x = F.relu(lin(x))
            if self.training and self.dropout > 0:
                x = _pair_dropout(x, self.dropout, (first + r0, first + r1), stream * 31 + i)
        return self.lins[-1](x)[:, 0]


class LinkModel(nn.Module):
    """Encoder (with sliced embeddings when there are no features) and decoder."""

    def __init__(self, cfg: TrainConfig, num_nodes: int, feature_dim: int, part: Partition) -> None:
        super().__init__()
        self.encoder = build_model(cfg, feature_dim or cfg.hidden, cfg.hidden)  # seeded from cfg.seed
        self.embedding = SlicedEmbedding(num_nodes, cfg.hidden, part, cfg.seed) if feature_dim == 0 else None
        torch.manual_seed(cfg.seed + 1)
        self.decoder = (MLPDecoder(cfg.hidden, cfg.hidden, cfg.decoder_layers, cfg.dropout) if cfg.decoder == "mlp"
                        else DotDecoder())

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        """Node embeddings of this rank's rows (row layout)."""
        return self.encoder(self.embedding(ctx) if self.embedding is not None else x, ctx)

    def replicated(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole (their gradients are summed over ranks): all but the embeddings."""
        return list(self.encoder.parameters()) + list(self.decoder.parameters())

    def decode(self, prod: torch.Tensor, pc: Comm, first: int = 0, stream: int = 0) -> torch.Tensor:
        """Scores (logits) of this rank's share ``pc.part.rows()`` of a chunk of pairs, from their products
        ``h_u * h_v`` on this rank's column slice [pairs, columns]; ``first``: the chunk's first pair in its batch
        (the dropout masks' rows). ntp.engine.link_pairs forms the products and runs the chunks."""
        return self.decoder(prod, pc, first, stream)
