"""R-GCN (Schlichtkrull et al. 2018), tensor parallel, on heterogeneous graphs.

A layer computes, for every node v of type t:

    h'_v = W_0 h_v + b + sum_{r into t} (1 / c_{v,r}) sum_{u in N_r(v)} W_r h_u

Tensor parallel, aggregate first (as PyG's ``RGCNConv``): each rank aggregates its column slice of every relation's
sources (``A_r @ H_s``, no communication; ntp.engine.tasks.hetero.relations), the messages of all relations into type t go to the
row layout in ONE all-to-all (only the (node, relation) pairs that have edges: ntp.engine.tasks.hetero.relations.TypedOperator), and the transforms ``W_r`` and the root ``W_0`` run on the rank's
own rows. The layer's output is split back to the column layout for the next layer (one all-to-all per type).
Relation weights: full ``[R, in, out]``, a basis decomposition ``W_r = sum_b a_rb V_b`` or block-diagonal ``W_r``.

Input: a type with features goes through its own Linear (row layout, then split); a featureless type has a learnable
embedding table that lives in the column layout (each rank holds all rows of its column slice: its own columns and
their optimiser state) and is gathered only for the root term.

Decoupled form: the NN stage (a per-type MLP, or the embedding) on the rows, one split, then ``--prop-steps`` of
relation-wise propagation ``H_t <- w_t H_t + sum_{r into t} w_r A_r H_s`` with learnable scalars (on the column slices,
no communication), and one gather of the target type's rows: 2 all-to-alls forward whatever the depth.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ntp.config import TrainConfig
from ntp.engine.device.precision import autocast, dtype
from ntp.engine.distributed.collectives import gather, split
from ntp.engine.distributed.partition import Partition
from ntp.engine.kernels import packed, streams
from ntp.engine.kernels.dropout import drop
from ntp.engine.kernels.linear import Linear, matmul
from ntp.engine.nn.embedding import SlicedEmbedding
from ntp.engine.tasks.hetero.relations import HeteroContext


def _dropout_stream(hc: HeteroContext, node_type: str, layer: int) -> int:
    """The mask's stream of (seed, step, layer, type): the row and the column layouts must draw the same one."""
    return streams.stream(streams.Purpose.HETERO, hc.seed, hc.step, layer, hc.types.index(node_type))


def hetero_dropout(
    x: torch.Tensor, p: float, hc: HeteroContext, node_type: str, layer: int, relu: bool = False
) -> torch.Tensor:
    """Dropout on a type's rows (of ``relu(x)`` with ``relu``) whose mask depends on (seed, step, layer, type,
    global row, column) only."""
    if p == 0.0:
        return packed.relu(x) if relu else x
    return drop(x, p, _dropout_stream(hc, node_type, layer), hc.row_offset(node_type), relu)


def add_rows(y: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``y`` with the rows of ``source`` added at ``index`` (``index_add``), summed in float32 at least whatever the
    dtypes (bf16: ntp.engine.device.precision), in ``y``'s dtype."""
    acc = torch.promote_types(torch.promote_types(y.dtype, source.dtype), torch.float32)
    return y.to(acc).index_add(0, index, source.to(acc)).to(y.dtype)


class HeteroModel(nn.Module):
    """An R-GCN model, run in the context's precision (ntp.engine.device.precision); its logits are float32."""

    def forward(self, x: dict[str, torch.Tensor], hc: HeteroContext) -> torch.Tensor:
        with autocast(hc.precision, hc.device):
            return self.compute(x, hc).float()

    def compute(self, x: dict[str, torch.Tensor], hc: HeteroContext) -> torch.Tensor:
        raise NotImplementedError

    def sliced(self) -> list[nn.Parameter]:
        """The column-sliced tables' parameters (each rank's own columns: no gradient all-reduce)."""
        return [t.weight for t in embedding_tables(self)]


def embedding_tables(module: nn.Module) -> list[SlicedEmbedding]:
    """Every column-sliced table of ``module`` (their slices are each rank's own: no gradient all-reduce)."""
    return [m for m in module.modules() if isinstance(m, SlicedEmbedding)]


class RelationWeights(nn.Module):
    """``W_r`` for R relations (full, basis or block-diagonal), applied per message row (``forward``) or to a
    destination's messages of all relations at once (``stacked``)."""

    def __init__(
        self, num_relations: int, in_dim: int, out_dim: int, decomposition: str = "none", num_bases: int = 0
    ) -> None:
        super().__init__()
        self.decomposition, self.in_dim, self.out_dim = decomposition, in_dim, out_dim
        if decomposition == "basis":
            self.bases = nn.Parameter(torch.empty(num_bases, in_dim, out_dim))
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))
            bound = math.sqrt(6.0 / (in_dim + out_dim))
            nn.init.uniform_(self.bases, -bound, bound)
            nn.init.xavier_uniform_(self.comp)
        elif decomposition == "block":
            if in_dim % num_bases or out_dim % num_bases:
                raise ValueError(
                    f"block-diagonal relation weights: widths {in_dim} -> {out_dim} are not divisible "
                    f"by --num-bases {num_bases}; choose a divisor of both"
                )
            self.blocks = nn.Parameter(torch.empty(num_relations, num_bases, in_dim // num_bases, out_dim // num_bases))
            bound = math.sqrt(6.0 / (in_dim // num_bases + out_dim // num_bases))
            nn.init.uniform_(self.blocks, -bound, bound)
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, in_dim, out_dim))
            bound = math.sqrt(6.0 / (in_dim + out_dim))
            nn.init.uniform_(self.weight, -bound, bound)

    def matrices(self, rels: list[int]) -> torch.Tensor:
        """[k, in, out] (full and basis forms; block-diagonal ones as full matrices)."""
        if self.decomposition == "basis":
            return torch.einsum("kb,bio->kio", self.comp[rels], self.bases)
        if self.decomposition == "block":
            return torch.stack([torch.block_diag(*self.blocks[r]) for r in rels])
        return self.weight[rels]

    def stacked(
        self, m: torch.Tensor, dst: torch.Tensor, pair_rel: torch.Tensor, rels: list[int], rows: int
    ) -> torch.Tensor:
        """``sum_p [dst_p = v] m[p] @ W_{pair_rel[p]}`` for every row v: the messages laid out as [rows, relations x
        in] (a row's pairs are distinct relations) times the stacked weights, one product for all relations."""
        slot = torch.zeros(max(rels) + 1, dtype=torch.long, device=m.device)
        slot[rels] = torch.arange(len(rels), device=m.device)
        flat = m.new_zeros(rows * len(rels), self.in_dim).index_copy(0, dst * len(rels) + slot[pair_rel], m)
        return matmul(flat.view(rows, -1), self.matrices(rels).reshape(len(rels) * self.in_dim, self.out_dim))

    def forward(self, m: torch.Tensor, pair_rel: torch.Tensor, rels: list[int]) -> torch.Tensor:
        """``m[p] @ W_{pair_rel[p]}`` for every message row p (``rels``: the relations that may occur, ascending).

        The rows are sorted by relation once and each relation's segment is multiplied by its weight: a gather and a
        scatter of the messages in all, whatever the number of relations (a mask per relation would copy every row
        once per relation)."""
        order = torch.argsort(pair_rel, stable=True)
        sizes = torch.bincount(pair_rel, minlength=max(rels) + 1)[rels].tolist()
        weights = None if self.decomposition == "block" else self.matrices(rels)  # block: per segment, no full W
        pieces = []
        # a segment may be empty; the output still depends on m, so every rank calls the gather's backward
        for j, (r, seg) in enumerate(zip(rels, m[order].split(sizes))):
            if self.decomposition == "block":
                nb = self.blocks.shape[1]
                y = torch.einsum("nbi,bio->nbo", seg.reshape(len(seg), nb, self.in_dim // nb), self.blocks[r])
                pieces.append(y.reshape(len(seg), self.out_dim))
            else:
                pieces.append(matmul(seg, weights[j]))
        y = torch.cat(pieces) if pieces else m.new_zeros(0, self.out_dim)
        return torch.empty_like(y).index_copy(0, order, y)


class HeteroInput(nn.Module):
    """Per type: a Linear of its features (row layout) or a column-sliced embedding table (featureless)."""

    def __init__(self, hc: HeteroContext, feature_dims: dict[str, int], width: int, seed: int) -> None:
        super().__init__()
        self.width = width
        self.linears = nn.ModuleDict({t: Linear(d, width) for t, d in feature_dims.items() if d})
        self.embeddings = nn.ModuleDict(
            {
                t: SlicedEmbedding(hc.counts[t], width, hc.comms[t].part, seed, table=i)
                for i, t in enumerate(hc.types)
                if not feature_dims[t]
            }
        )

    def forward(self, x: dict[str, torch.Tensor], hc: HeteroContext) -> tuple[dict, dict]:
        """(rows, cols) of every type: the row layout and the column layout of the input."""
        rows, cols = {}, {}
        for t in hc.types:
            if t in self.linears:
                rows[t] = self.linears[t](x[t])
                cols[t] = split(rows[t], hc.comms[t])
            else:  # float32 parameters, in the run's precision from here on
                cols[t] = self.embeddings[t].weight.to(dtype(hc.precision))
                rows[t] = gather(cols[t], hc.comms[t], self.width)
        return rows, cols


def stacks_relations(rows: int, num_rels: int, pairs: int, in_dim: int, out_dim: int) -> bool:
    """Whether a layer transforms a type's messages as one [rows, relations x in] product (RelationWeights.stacked)
    rather than per (node, relation) pair: whichever holds fewer floats (a wide output over few relations stacks; many
    relations over sparse pairs do not). Decided on the type's global sizes, so every world size takes the same path."""
    return rows * (num_rels * in_dim + out_dim) <= pairs * (in_dim + out_dim)


class RGCNLayer(nn.Module):
    def __init__(self, num_relations: int, in_dim: int, out_dim: int, decomposition: str, num_bases: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.root = Linear(in_dim, out_dim)
        self.rel = RelationWeights(num_relations, in_dim, out_dim, decomposition, num_bases)

    def forward(self, rows: dict, cols: dict, hc: HeteroContext, dst_types: list[str]) -> dict:
        out = {}
        everything = torch.cat([cols[t] for t in hc.types])  # the sources of every type, global ids
        for t in dst_types:
            y = self.root(rows[t])
            if hc.into[t]:
                msgs = gather(hc.ops[t](everything), hc.pair_comms[t], self.in_dim)  # this rank's pairs, all columns
                dst, rel = hc.own_pairs(t)
                if stacks_relations(hc.counts[t], len(hc.into[t]), hc.ops[t].num_pairs, self.in_dim, self.rel.out_dim):
                    y = y + self.rel.stacked(msgs, dst, rel, hc.into[t], len(y))
                else:
                    y = add_rows(y, dst, self.rel(msgs, rel, hc.into[t]))
            out[t] = y
        return out


class FeaturelessLayer(nn.Module):
    """R-GCN's first layer when no node type has features (entity classification, as AIFB): the input is one-hot, so
    ``W_r`` is a table of rows and the layer needs no communication at all. Tables live in the column layout
    (each rank holds every row of its column slice): a root table ``W_0`` and, per basis b, ``V_b`` over all nodes
    (global ids); ``W_r = sum_b a_rb V_b`` (basis), or one table per relation (none: ``a`` is the identity). Each
    pair (v, r) of the typed CSR gets ``sum_b a_rb (A_r V_b)[v]``; the output stays in the column layout."""

    def __init__(self, hc: HeteroContext, out_dim: int, decomposition: str, num_bases: int, seed: int) -> None:
        super().__init__()
        n, part = sum(hc.counts.values()), Partition(sum(hc.counts.values()), hc.comm.world, hc.comm.rank)
        self.width, self.c0, self.c1 = out_dim, *part.cols(out_dim)
        self.root = SlicedEmbedding(n, out_dim, part, seed, table=0)
        if decomposition == "basis":
            self.bases = nn.ModuleList(SlicedEmbedding(n, out_dim, part, seed, table=1 + b) for b in range(num_bases))
            self.comp = nn.Parameter(torch.empty(hc.num_relations, num_bases))
            nn.init.xavier_uniform_(self.comp)
        else:  # the relations' tables stacked: row r * n + u is W_r[u]
            stacked = Partition(n * hc.num_relations, hc.comm.world, hc.comm.rank)
            self.tables = SlicedEmbedding(n * hc.num_relations, out_dim, stacked, seed, fan_rows=n, table=1)
            self.comp = None
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, hc: HeteroContext) -> dict:
        out = {}
        for t in hc.types:
            o = hc.offsets[t]
            y = self.root.weight[o : o + hc.counts[t]] + self.bias[self.c0 : self.c1]
            if hc.into[t]:
                op = hc.ops[t]
                if self.comp is None:  # each pair reads its own relation's table
                    msgs = hc.relation_ops()[t](self.tables.weight)
                else:
                    per = torch.stack([op(v.weight) for v in self.bases])  # [B, pairs, slice]
                    msgs = torch.einsum("bpc,pb->pc", per, self.comp[op.pair_rel])
                y = add_rows(y, op.pair_dst, msgs)
            out[t] = y.to(dtype(hc.precision))  # float32 tables and sums; activations in the run's precision
        return out


def relu_column_dropout(
    h: torch.Tensor, p: float, hc: HeteroContext, node_type: str, layer: int, width: int, cols: tuple[int, int]
) -> torch.Tensor:
    """ReLU, then :func:`hetero_dropout`'s mask, on a column slice (all rows of the type)."""
    if p == 0.0:
        return packed.relu(h)
    return drop(h, p, _dropout_stream(hc, node_type, layer), 0, relu=True, column=cols[0], width=width)


class CoupledRGCN(HeteroModel):
    """``nn_layers`` R-GCN layers (width ``hidden``), ReLU and dropout between them; logits of the target type."""

    def __init__(
        self, cfg: TrainConfig, hc: HeteroContext, feature_dims: dict[str, int], target: str, out_dim: int
    ) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.target, self.dropout = target, cfg.dropout
        dims = [cfg.hidden] * cfg.nn_layers + [out_dim]
        #: no type has features: R-GCN's one-hot first layer (tables), else per-type inputs then R-GCN layers
        self.featureless = not any(feature_dims.values()) and cfg.decomposition != "block"
        if self.featureless:
            self.first = FeaturelessLayer(hc, dims[1], cfg.decomposition, cfg.num_bases, cfg.seed)
            dims = dims[1:]
        else:
            self.input = HeteroInput(hc, feature_dims, cfg.hidden, cfg.seed)
        self.layers = nn.ModuleList(
            RGCNLayer(hc.num_relations, a, b, cfg.decomposition, cfg.num_bases) for a, b in zip(dims[:-1], dims[1:])
        )

    def _first(self, hc: HeteroContext) -> tuple[dict, dict]:
        width = self.first.width
        cols = self.first(hc)
        if not self.layers:
            return {}, cols
        p = self.dropout if self.training else 0.0
        cols = {t: relu_column_dropout(h, p, hc, t, 0, width, (self.first.c0, self.first.c1)) for t, h in cols.items()}
        return {t: gather(h, hc.comms[t], width) for t, h in cols.items()}, cols

    def compute(self, x: dict[str, torch.Tensor], hc: HeteroContext) -> torch.Tensor:
        rows, cols = self._first(hc) if self.featureless else self.input(x, hc)
        if not self.layers:
            return gather(cols[self.target], hc.comms[self.target], self.first.width)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            out = layer(rows, cols, hc, [self.target] if i == last else hc.types)
            if i == last:
                return out[self.target]
            p = self.dropout if self.training else 0.0
            rows = {t: hetero_dropout(h, p, hc, t, i + self.featureless, relu=True) for t, h in out.items()}
            cols = {t: split(h, hc.comms[t]) for t, h in rows.items()}
        raise AssertionError("unreachable")


class DecoupledRGCN(HeteroModel):
    """NN stage per type (MLP of its features to the class width, or an embedding), then relation-wise propagation."""

    def __init__(
        self, cfg: TrainConfig, hc: HeteroContext, feature_dims: dict[str, int], target: str, out_dim: int
    ) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.target, self.dropout, self.steps, self.out_dim = target, cfg.dropout, cfg.prop_steps, out_dim
        self.mlps = nn.ModuleDict()
        for t, d in feature_dims.items():
            if d:
                dims = [d] + [cfg.hidden] * (cfg.nn_layers - 1) + [out_dim]
                self.mlps[t] = nn.ModuleList(Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.embeddings = nn.ModuleDict(
            {
                t: SlicedEmbedding(hc.counts[t], out_dim, hc.comms[t].part, cfg.seed, table=i)
                for i, t in enumerate(hc.types)
                if not feature_dims[t]
            }
        )
        # mixing weights: one per type (its own state) then one per relation, each 1 / (1 + relations into the type)
        init = [1.0 / (1 + len(hc.into[t])) for t in hc.types] + [1.0 / (1 + len(hc.into[d])) for _, d in hc.relations]
        self.mix = nn.Parameter(torch.tensor(init))

    def _nn(self, t: str, x: torch.Tensor, hc: HeteroContext) -> torch.Tensor:
        lins, p = self.mlps[t], self.dropout if self.training else 0.0
        x = hetero_dropout(x, p, hc, t, 0)
        for i, lin in enumerate(lins):
            x = lin(x)
            if i < len(lins) - 1:
                x = hetero_dropout(x, p, hc, t, i + 1, relu=True)
        return x

    def compute(self, x: dict[str, torch.Tensor], hc: HeteroContext) -> torch.Tensor:
        act = dtype(hc.precision)
        h = {
            t: (split(self._nn(t, x[t], hc), hc.comms[t]) if t in self.mlps else self.embeddings[t].weight.to(act))
            for t in hc.types
        }
        n_types = len(hc.types)
        for _ in range(self.steps):
            everything = torch.cat([h[t] for t in hc.types])
            new = {}
            for j, t in enumerate(hc.types):
                new[t] = self.mix[j] * h[t]
                if hc.into[t]:
                    op = hc.ops[t]
                    msgs = op(everything) * self.mix[n_types + op.pair_rel].unsqueeze(1)
                    new[t] = add_rows(new[t], op.pair_dst, msgs)
            h = new
        return gather(h[self.target], hc.comms[self.target], self.out_dim)


def build_rgcn(
    cfg: TrainConfig, hc: HeteroContext, feature_dims: dict[str, int], target: str, out_dim: int
) -> nn.Module:
    cls = CoupledRGCN if cfg.arch == "coupled" else DecoupledRGCN
    return cls(cfg, hc, feature_dims, target, out_dim)


def parameter_sizes(
    cfg: TrainConfig, counts: dict[str, int], feature_dims: dict[str, int], num_relations: int, out_dim: int
) -> tuple[list[tuple[int, int]], int]:
    """What :func:`build_rgcn` holds, without building it (the memory plan): the embedding tables' whole shapes
    ``(rows, width)`` (sliced over ranks by columns) and the number of replicated parameters."""
    n, r, b = sum(counts.values()), num_relations, cfg.num_bases
    if cfg.arch == "decoupled":
        tables = [(counts[t], out_dim) for t, d in feature_dims.items() if not d]
        mlps = sum(
            _mlp_params([d] + [cfg.hidden] * (cfg.nn_layers - 1) + [out_dim]) for d in feature_dims.values() if d
        )
        return tables, mlps + len(counts) + r
    dims = [cfg.hidden] * cfg.nn_layers + [out_dim]
    if not any(feature_dims.values()) and cfg.decomposition != "block":  # FeaturelessLayer
        w = dims[1]
        tables = [(n, w)] + ([(n, w)] * b if cfg.decomposition == "basis" else [(n * r, w)])
        replicated, dims = w + (r * b if cfg.decomposition == "basis" else 0), dims[1:]
    else:  # HeteroInput
        tables = [(counts[t], cfg.hidden) for t, d in feature_dims.items() if not d]
        replicated = sum(_mlp_params([d, cfg.hidden]) for d in feature_dims.values() if d)
    for a, c in zip(dims[:-1], dims[1:]):
        relation = {"basis": b * a * c + r * b, "block": r * a * c // max(b, 1)}.get(cfg.decomposition, r * a * c)
        replicated += a * c + c + relation
    return tables, replicated


def _mlp_params(dims: list[int]) -> int:
    return sum(a * c + c for a, c in zip(dims[:-1], dims[1:]))
