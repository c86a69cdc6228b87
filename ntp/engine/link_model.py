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
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ntp.config import TrainConfig
from ntp.engine.collectives import Comm, gather, reduce_scatter_rows
from ntp.engine.context import GraphContext
from ntp.engine.dropout import drop
from ntp.engine.linear import Linear
from ntp.engine.models import build_model
from ntp.engine.partition import Partition
from ntp.engine.precision import dtype
from ntp.errors import CheckpointError

#: Communication kind of the pair exchanges (in the workers' byte counts).
LINK = "link"
#: Embedding initialisation draws tiles of this many rows, each from its own seed (any world size: same matrix).
INIT_TILE_ROWS = 4096


class SlicedEmbedding(nn.Module):
    """Learnable embeddings [n, width] of which this rank holds all n rows of its column slice (the graph layout);
    ``forward`` gathers them into the row layout, the encoder's input. Xavier-uniform initialisation (as OGB's
    examples) drawn tile by tile from the seed, so every world size starts from the same matrix.

    Its state dict holds the whole matrix, and so does the optimiser's for its per-element state (Adam's moments;
    :meth:`track_optimizer`): :meth:`snapshot` (a collective) gathers them on every rank. Loading whole matrices keeps
    this rank's columns, so a checkpoint written with any number of ranks resumes with any other."""

    def __init__(self, num_nodes: int, width: int, part: Partition, seed: int, fan_rows: int | None = None) -> None:
        super().__init__()
        self.num_nodes, self.width, self.world = num_nodes, width, part.world
        self.c0, self.c1 = part.cols(width)
        bound = math.sqrt(6.0 / ((fan_rows or num_nodes) + width))  # fan_rows: stacked tables scale as one table
        weight = torch.empty(num_nodes, self.c1 - self.c0)
        gen = torch.Generator()
        for t0 in range(0, num_nodes, INIT_TILE_ROWS):
            gen.manual_seed((seed * 1_000_003 + t0 // INIT_TILE_ROWS) * 7919 + 17)
            tile = torch.rand(min(INIT_TILE_ROWS, num_nodes - t0), width, generator=gen)
            weight[t0 : t0 + len(tile)] = (2 * tile[:, self.c0 : self.c1] - 1) * bound
        self.weight = nn.Parameter(weight)
        self.full: torch.Tensor | None = None  #: the whole matrix as of the last snapshot (several ranks)
        self.full_state: dict[str, torch.Tensor] | None = None  #: the optimiser's whole state, likewise
        self.optimizer: torch.optim.Optimizer | None = None

    def forward(self, ctx: GraphContext) -> torch.Tensor:
        """This rank's rows, in the run's precision (the encoder's input, as features would be)."""
        return ctx.from_graph(self.weight.to(dtype(ctx.precision)), self.width)

    @torch.no_grad()
    def snapshot(self, ctx: GraphContext, with_optimizer: bool = False) -> None:
        """Gather the whole matrix (and the tracked optimiser's state of it) on every rank, for the state dicts;
        every rank must call it."""
        if self.world == 1:
            return
        self.full = self._whole(self.weight, ctx)
        if with_optimizer and self.optimizer is not None:
            state = self.optimizer.state.get(self.weight, {})
            self.full_state = {key: self._whole(v, ctx) for key, v in sorted(state.items()) if self._is_slice(v)}

    def _whole(self, t: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        rows = ctx.from_graph(t.detach(), self.width)
        return ctx.comm.all_gather_rows(rows.to(ctx.device).contiguous(), LINK).cpu()

    def _is_slice(self, t: torch.Tensor) -> bool:
        return t.shape == self.weight.shape

    def _own_columns(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a whole [n, width] matrix; anything else as it is."""
        return t[:, self.c0 : self.c1] if t.dim() == 2 and t.shape == (self.num_nodes, self.width) else t

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001 (torch's signature)
        if self.world == 1:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self._require(self.full).clone()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001
        key = prefix + "weight"
        if key in state_dict and self.world > 1 and state_dict[key].shape == (self.num_nodes, self.width):
            self.full = state_dict[key].detach().cpu().clone()
            state_dict[key] = self._own_columns(state_dict[key])
        return super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.state_dict()`` holds the whole matrices of this parameter's per-element state (as of the last
        snapshot with the optimiser), and ``load_state_dict`` keeps this rank's columns of them."""
        self.optimizer = optimizer
        index = [id(p) for group in optimizer.param_groups for p in group["params"]].index(id(self.weight))
        whole_shape = (self.num_nodes, self.width)

        def save(_opt: torch.optim.Optimizer, sd: dict) -> None:
            if self.world > 1 and index in sd["state"]:  # a new dict: the one there is the optimiser's own state
                sd["state"][index] = {**sd["state"][index], **self._require(self.full_state)}

        def load(_opt: torch.optim.Optimizer, sd: dict) -> None:
            state = sd["state"].get(index, {})
            for key, v in state.items():
                if v.dim() == 2 and v.shape != whole_shape:
                    raise CheckpointError(f"the optimiser state {key!r} of the node embeddings in this checkpoint "
                                          f"is one rank's columns {tuple(v.shape)}, not the whole {whole_shape} "
                                          "(written by an older version): start afresh in another --checkpoint-dir")
            if state:
                self.full_state = {k: v.detach().cpu().clone() for k, v in state.items() if v.dim() == 2}
                sd["state"] = {**sd["state"], index: {k: self._own_columns(v) for k, v in state.items()}}

        optimizer.register_state_dict_post_hook(save)
        optimizer.register_load_state_dict_pre_hook(load)

    @staticmethod
    def _require(full: Any) -> Any:
        if full is None:
            raise RuntimeError("the embeddings are sliced over ranks and no snapshot was gathered: call "
                               "SlicedEmbedding.snapshot on every rank first")
        return full


def _relu_pair_dropout(x: torch.Tensor, p: float, rows: tuple[int, int], stream: int) -> torch.Tensor:
    """ReLU, then dropout of the pairs ``rows`` (their indices in the batch): the mask depends on them, not on the
    ranks."""
    if p == 0.0:
        return F.relu(x)
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
            x = _relu_pair_dropout(lin(x), p, (first + r0, first + r1), stream * 31 + i)
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
        (the dropout masks' rows). ntp.engine.link_pairs forms the products and runs the chunks."""
        return self.decoder(prod, pc, first, stream)
