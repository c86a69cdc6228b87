"""R-GCN's memory plan: what a rank holds, and the chunks of the relation-wise aggregation that ``--memory-budget``
leaves room for (the homogeneous plan's formulas, ntp.engine.memory.chunks, applied to every typed operator).

A rank holds, besides one chunk's working set: the relations and their typed operators (both directions), its
feature rows, its column slices of the embedding tables with their gradient and Adam moments (and the whole tables
that the state dicts gather when there are several ranks), the replicated parameters, and per layer the activations
of every type in the row and the column layouts with the messages of the (node, relation) pairs. Each typed operator
(forward over pairs, backward over sources; also the one-hot layer's operators over stacked tables) is cut into the
largest row blocks whose working set fits what the resident parts leave; the operator with the costliest single row
is planned first, so an impossible budget names the smallest budget that works.

Under ``--precision bf16`` the plan still counts float32 bytes: an upper bound there (a step's peak live bytes on a
CPU rank, hidden 64, 8,400 vertices and 100,000 edges: coupled 17.6 MB in bf16 against 29.1 in fp32, decoupled 5.1
against 8.5, the one-hot layer 50.9 against 52.8; its float32 tables and sums keep that one close).
"""

from __future__ import annotations

import numpy as np

from ntp.config import TrainConfig
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.chunks import ChunkPlan, make_plan
from ntp.engine.memory.parts import ACTIVATION_COPIES, PARAMETER_COPIES, nn_stage_bytes, rank_slice_width
from ntp.engine.tasks.hetero.data import RelationData
from ntp.engine.tasks.hetero.rgcn import parameter_sizes, stacks_relations

#: Bytes per edge of a typed operator's direction: int64 column index and float32 value.
OPERATOR_EDGE_BYTES = 8 + 4
#: What the remedy of an impossible budget can be for R-GCN (no offload, no CPU NN stage).
WAYS_OUT = "use more ranks (narrower column slices), or a smaller --hidden"


def operator_degrees(relations: list[RelationData], counts: dict[str, int], one_hot: bool = False) -> dict:
    """Row degrees of every typed operator, in its row order (ntp.engine.tasks.hetero.relations.TypedOperator): ``("forward",
    t)`` over the (node, relation) pairs into type t, ``("backward", t)`` over the sources (global ids); with
    ``one_hot`` also the one-hot layer's operators over the stack of one table per relation."""
    types = list(counts)
    offsets = dict(zip(types, np.cumsum([0] + [counts[t] for t in types]).tolist()))
    n = sum(counts.values())
    out = {}
    for t in types:
        into = [(i, r) for i, r in enumerate(relations) if r.dst == t]
        deg = np.stack([np.diff(np.asarray(r.indptr, np.int64)) for _, r in into], 1) if into else np.zeros((0, 1))
        pairs = deg.reshape(-1)
        pairs = pairs[pairs > 0]  # pairs sorted by node, then relation: the typed CSR's rows
        sources = [np.asarray(r.indices, np.int64) + offsets[r.src] for _, r in into]
        out["forward", t] = pairs
        out["backward", t] = _counts(sources, n)
        if one_hot:
            out["one-hot forward", t] = pairs
            out["one-hot backward", t] = _counts([s + i * n for (i, _), s in zip(into, sources)], n * len(relations))
    return out


def _counts(ids: list[np.ndarray], length: int) -> np.ndarray:
    return np.bincount(np.concatenate(ids), minlength=length) if ids else np.zeros(length, np.int64)


def resident_parts(
    cfg: TrainConfig,
    relations: list[RelationData],
    counts: dict[str, int],
    feature_dims: dict[str, int],
    out_dim: int,
    world: int,
    degrees: dict,
) -> dict[str, int]:
    """What a rank holds besides one chunk of aggregation, by part (bytes; float32)."""
    tables, replicated = parameter_sizes(cfg, counts, feature_dims, len(relations), out_dim)
    n = sum(counts.values())
    rows = {t: ceil_div(c, world) for t, c in counts.items()}
    ops = sum(8 * (len(d) + 1) + OPERATOR_EDGE_BYTES * int(d.sum()) for d in degrees.values())
    pairs = sum(len(d) for (kind, _), d in degrees.items() if kind == "forward")
    gathered = (2 + 2 * bool(cfg.checkpoint_dir)) * sum(r * w for r, w in tables) if world > 1 else 0
    return {
        "relations": sum(8 * (len(r.indptr) + len(r.indices)) for r in relations),
        "typed operators": ops + 16 * pairs,  # and each pair's destination and relation
        "features": 4 * sum(rows[t] * d for t, d in feature_dims.items()),
        "embedding tables": 4 * PARAMETER_COPIES * sum(r * ceil_div(w, world) for r, w in tables),
        "gathered tables": 4 * gathered,  # whole tables: state dict, best model, checkpointed Adam moments
        "parameters": 4 * PARAMETER_COPIES * replicated,
        "activations": _activation_bytes(
            cfg,
            counts,
            feature_dims,
            degrees,
            out_dim,
            world,
            n,
            rows,
            {t: sum(r.dst == t for r in relations) for t in counts},
        ),
    }


def _activation_bytes(
    cfg: TrainConfig,
    counts: dict[str, int],
    feature_dims: dict[str, int],
    degrees: dict,
    out_dim: int,
    world: int,
    n: int,
    rows: dict[str, int],
    rels_into: dict[str, int],
) -> int:
    """Per layer: every type's rows (in and out widths) and column slice, every pair's message in the column layout
    and this rank's pairs in the row layout, the relation transform's working floats, and the stacked sources with
    their gradient."""
    pairs = {t: len(d) for (kind, t), d in degrees.items() if kind == "forward"}
    if cfg.arch == "decoupled":
        s = ceil_div(out_dim, world)
        nn = sum(
            nn_stage_bytes(rows[t], d, cfg.hidden, out_dim, cfg.nn_layers, 0, input_dropout=cfg.first_dropout)
            for t, d in feature_dims.items()
            if d
        )
        step = sum((counts[t] + pairs[t]) * s for t in counts) * ACTIVATION_COPIES + 2 * n * s
        return nn + 4 * cfg.prop_steps * step
    dims = [cfg.hidden] * cfg.nn_layers + [out_dim]
    per_pair = 1 + (cfg.num_bases if cfg.decomposition == "basis" else 0)  # the one-hot layer's per-basis messages
    total = 0
    for a, b in zip(dims[:-1], dims[1:]):
        s = ceil_div(a, world)
        per_type = sum(
            rows[t] * (a + b)
            + counts[t] * s
            + pairs[t] * s * per_pair
            + ceil_div(pairs[t], world) * a
            + _transform_floats(rows[t], rels_into[t], pairs[t], ceil_div(pairs[t], world), a, b, counts[t])
            for t in counts
        )
        total += per_type * ACTIVATION_COPIES + 2 * n * s
    return 4 * total


def _transform_floats(rows: int, num_rels: int, pairs: int, own_pairs: int, a: int, b: int, count: int) -> int:
    """The relation transform's working floats: messages laid out per row and relation, or one output per pair."""
    return rows * num_rels * a if stacks_relations(count, num_rels, pairs, a, b) else own_pairs * b


def plan_operators(
    cfg: TrainConfig,
    relations: list[RelationData],
    counts: dict[str, int],
    feature_dims: dict[str, int],
    out_dim: int,
    world: int,
) -> dict:
    """The row blocks of every typed operator (ChunkPlan by :func:`operator_degrees` key) that ``--memory-budget``
    leaves room for; MemoryPlanError (naming the parts and the smallest budget that works) when it leaves none."""
    one_hot = cfg.arch == "coupled" and not any(feature_dims.values()) and cfg.decomposition != "block"
    degrees = operator_degrees(relations, counts, one_hot)
    resident = resident_parts(cfg, relations, counts, feature_dims, out_dim, world, degrees)
    width = rank_slice_width(cfg, out_dim, world)
    plans = {}
    for key in sorted(degrees, key=lambda k: -int(degrees[k].max(initial=0))):  # the costliest row first
        d = degrees[key]
        plans[key] = make_plan(
            d,
            np.zeros_like(d),
            memory_budget=cfg.memory_budget_bytes,
            width=width,
            resident=resident,
            ways_out=WAYS_OUT,
        )
    return plans


def summary(plans: dict) -> ChunkPlan:
    """The plan of the operator cut into the most chunks, its reason naming how many operators there are."""
    key = max(plans, key=lambda k: plans[k].num_chunks)
    plan = plans[key]
    return ChunkPlan(
        plan.bounds,
        f"{plan.reason}; R-GCN's {key[0]} operator of type {key[1]!r}, the most cut of {len(plans)} typed operators",
    )
