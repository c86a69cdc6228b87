"""Checks made before any rank starts: the store opens and has something to train on, the output paths can be
written, a resumed checkpoint loads and fits the options, and the memory plan of an explicit budget can work.

A problem found here is the user's input (StoreError, ConfigError, MemoryPlanError): it is reported at once, with
its fix, instead of inside epoch 0 of every rank, and schedulers do not retry it.
"""
from __future__ import annotations

import torch

from ntp.engine.train import checkpoint
from ntp.engine.memory.chunks import ChunkPlan, make_plan, uniform_plan
from ntp.engine.device.transfer import streams_topology
from ntp.engine.nn.models import build_model
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.placement import propagated_width, rank_resident_parts, stream_parts, ways_out
from ntp.engine.device.precision import element_bytes
from ntp.engine.train.setup import count_train_labels
from ntp.errors import ConfigError
from ntp.spec import LaunchSpec


def check_launch(spec: LaunchSpec) -> ChunkPlan | None:
    """Open the store (its own message if it is missing or damaged), check the run's inputs and outputs, and compute
    the chunk plan that an explicit ``--chunk-rows`` or ``--memory-budget`` asks for (raising MemoryPlanError when
    it cannot work). Returns that plan, or None when the plan is left to each rank's free device memory."""
    cfg = spec.config
    if not cfg.store:
        raise ConfigError("no graph store given; pass --store PATH (build one with `ntp data prepare NAME`)")
    from storage import open_store

    store = open_store(cfg.store)
    if store.meta.task_type == "link":  # it trains on the store's edge splits (always non-empty)
        from ntp.engine.tasks.link.task import check_link_config

        check_link_config(cfg)
    else:
        count_train_labels(store.meta.name, torch.from_numpy(store.labels()), store.split("train"))
    checkpoint.check_output_paths(cfg)
    if cfg.resume:
        _check_resume(spec, store.meta)
    return _chunk_plan(spec, store)


def _check_resume(spec: LaunchSpec, meta) -> None:  # noqa: ANN001 (storage's StoreMeta)
    """The checkpoint a rank would resume from loads and fits the options (as the ranks resolve them for the store's
    task); the ranks warn about what they skip."""
    cfg = spec.config.for_task(meta.task_type)
    found = checkpoint.latest_loadable(cfg.checkpoint_dir, "cpu", lambda message: None)
    if found is not None:
        path, state = found
        checkpoint.check_resumable(state, path, cfg, meta.fingerprint, lambda message: None)


def _chunk_plan(spec: LaunchSpec, store) -> ChunkPlan | None:
    """The plan every rank will compute (ntp.engine.memory.chunks.make_plan), with what stays resident on a rank."""
    cfg, meta = spec.config, store.meta
    if cfg.chunk_rows:
        return uniform_plan(meta.num_nodes, cfg.chunk_rows)
    if not cfg.memory_budget_bytes or spec.mode == "data":
        return None
    if meta.hetero:
        return _hetero_plan(spec, store)
    symmetric = bool(meta.preprocessing.get("symmetrized"))
    # on a GPU, nn_device "auto" may move the NN stage to the host; the ranks decide (and check) that themselves
    nn_on_device = spec.device == "cpu" or cfg.nn_device == "device"
    if meta.task_type == "link":
        resident, out_dim = _link_parts(spec, store, symmetric, nn_on_device), cfg.hidden
    else:
        out_dim = meta.num_classes if meta.task_type == "multiclass" else meta.num_tasks
        params = sum(p.numel() for p in build_model(cfg, meta.feature_dim, out_dim).parameters())
        shape = dict(num_nodes=meta.num_nodes, num_edges=meta.num_edges, feature_dim=meta.feature_dim,
                     out_dim=out_dim, world=spec.world_size, params=params, device_type=spec.device,
                     symmetric=symmetric)
        if cfg.nn_device == "stream":  # the ranks size the blocks from the budget alike
            resident = stream_parts(cfg, room=cfg.memory_budget_bytes, **shape)[1]
        else:
            resident = rank_resident_parts(cfg, nn_on_device=nn_on_device, **shape)
    slice_width = ceil_div(max(propagated_width(cfg.arch, cfg.hidden, out_dim), 1), spec.world_size)
    return make_plan(store.in_degrees(), store.out_degrees(), memory_budget=cfg.memory_budget_bytes,
                     width=slice_width, resident=resident, element_bytes=element_bytes(cfg.precision),
                     ways_out=ways_out(resident), pipelined=cfg.overlap and spec.world_size > 1,
                     streamed=streams_topology(cfg.offload, spec.device))


def _hetero_plan(spec: LaunchSpec, store) -> ChunkPlan:
    """R-GCN's plan every rank will compute (ntp.engine.tasks.hetero.memory), from the store's relations and types."""
    from ntp.engine.tasks.hetero.data import load_relations
    from ntp.engine.tasks.hetero.memory import plan_operators, summary

    types = store.meta.hetero["node_types"]
    plans = plan_operators(spec.config, load_relations(store), {t["name"]: t["count"] for t in types},
                           {t["name"]: t["feature_dim"] for t in types}, store.meta.num_classes, spec.world_size)
    return summary(plans)


def _link_parts(spec: LaunchSpec, store, symmetric: bool, nn_on_device: bool) -> dict[str, int]:
    """A link rank's parts (ntp.engine.tasks.link.memory), with the model every rank will build."""
    from ntp.engine.tasks.link.memory import resident_parts
    from ntp.engine.tasks.link.model import replicated_size

    cfg, meta = spec.config, store.meta
    return resident_parts(cfg, num_nodes=meta.num_nodes, num_edges=meta.num_edges, feature_dim=meta.feature_dim,
                          splits={name: store.link_split_shapes(name) for name in meta.split_names},
                          world=spec.world_size, params=replicated_size(cfg, meta.feature_dim),
                          device_type=spec.device, symmetric=symmetric, nn_on_device=nn_on_device)
