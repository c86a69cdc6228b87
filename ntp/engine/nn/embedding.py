"""Learnable node embeddings column-sliced across ranks (the graph layout): the input of a link model on a graph
without features, and R-GCN's tables of featureless node types."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ntp.engine.device.precision import dtype
from ntp.engine.distributed.partition import Partition
from ntp.engine.distributed.traffic import EMBEDDING
from ntp.engine.kernels import streams
from ntp.engine.parallel.context import GraphContext
from ntp.errors import CheckpointError

#: Embedding initialisation draws tiles of this many rows, each from its own seed (any world size: same matrix).
INIT_TILE_ROWS = 4096


class SlicedEmbedding(nn.Module):
    """Learnable embeddings [n, width] of which this rank holds all n rows of its column slice (the graph layout);
    ``forward`` gathers them into the row layout, the encoder's input. Xavier-uniform initialisation (as OGB's
    examples) drawn tile by tile from the seed, so every world size starts from the same matrix; each tile of each
    ``table`` of a model from its own stream (ntp.engine.kernels.streams).

    Its state dict holds the whole matrix, and so does the optimiser's for its per-element state (Adam's moments;
    :meth:`track_optimizer`): :meth:`snapshot` (a collective) gathers them on every rank. Loading whole matrices keeps
    this rank's columns, so a checkpoint written with any number of ranks resumes with any other."""

    def __init__(
        self, num_nodes: int, width: int, part: Partition, seed: int, fan_rows: int | None = None, table: int = 0
    ) -> None:
        super().__init__()
        self.num_nodes, self.width, self.world = num_nodes, width, part.world
        self.c0, self.c1 = part.cols(width)
        bound = math.sqrt(6.0 / ((fan_rows or num_nodes) + width))  # fan_rows: stacked tables scale as one table
        weight = torch.empty(num_nodes, self.c1 - self.c0)
        gen = torch.Generator()
        for t0 in range(0, num_nodes, INIT_TILE_ROWS):
            gen.manual_seed(streams.stream(streams.Purpose.EMBEDDING, seed, t0 // INIT_TILE_ROWS, table))
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
        return ctx.comm.all_gather_rows(rows.to(ctx.device).contiguous(), EMBEDDING).cpu()

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
                    raise CheckpointError(
                        f"the optimiser state {key!r} of the node embeddings in this checkpoint "
                        f"is one rank's columns {tuple(v.shape)}, not the whole {whole_shape} "
                        "(written by an older version): start afresh in another --checkpoint-dir"
                    )
            if state:
                self.full_state = {k: v.detach().cpu().clone() for k, v in state.items() if v.dim() == 2}
                sd["state"] = {**sd["state"], index: {k: self._own_columns(v) for k, v in state.items()}}

        optimizer.register_state_dict_post_hook(save)
        optimizer.register_load_state_dict_pre_hook(load)

    @staticmethod
    def _require(full: Any) -> Any:
        if full is None:
            raise RuntimeError(
                "the embeddings are sliced over ranks and no snapshot was gathered: call "
                "SlicedEmbedding.snapshot on every rank first"
            )
        return full
