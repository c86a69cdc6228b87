"""Everything one rank trains with, built from a config and the process group: data, context, model, optimiser."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.memory import placement
from ntp.engine.device import precision
from ntp.engine.train.checkpoint import check_output_paths
from ntp.engine.parallel.context import GraphContext
from ntp.engine.graph.data import GraphData, load_rank_data, topology_bytes
from ntp.engine.parallel.data_parallel import DataParallelContext
from ntp.engine.distributed.collectives import Comm, check_same_on_all_ranks
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.nn.models import build_model
from ntp.engine.graph.node_shared import job_key, on_node
from ntp.engine.distributed.partition import Partition
from ntp.errors import ConfigError
from ntp.records import EpochRecord
from ntp.spec import mode_for

SPLITS = ("train", "valid", "test")
#: (config, world size, rank) -> this rank's GraphData
DataLoader = Callable[[TrainConfig, int, int], GraphData]


@dataclass
class Best:
    """The best evaluation so far (by validation metric) and the weights that reached it."""

    epoch: int = -1
    valid: float = float("-inf")
    test: float | None = None
    state: dict | None = None


@dataclass
class Job:
    """Everything one rank trains with."""

    cfg: TrainConfig
    env: DistEnv
    data: GraphData
    comm: Comm
    ctx: GraphContext
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor  # this rank's feature rows
    y: torch.Tensor  # labels of this rank's rows
    local_split: dict[str, torch.Tensor]  # split name -> local row ids of labeled vertices in the split
    global_train_count: int
    best: Best = field(default_factory=Best)
    link: Any = None  #: link prediction's edges, epoch and evaluation (ntp.engine.tasks.link.task.LinkTask); None: node task
    task: Any = None  #: another task's own epoch and evaluation (heterogeneous: ntp.engine.tasks.hetero.task.HeteroTask)
    history: list[EpochRecord] = field(default_factory=list)  # epoch records (rank 0 writes them)


def setup(cfg: TrainConfig, env: DistEnv, load: DataLoader | None = None) -> Job:
    cfg = cfg.replace(mode=mode_for(cfg.mode, env.world))
    if env.world > 1 and cfg.mode == "single":
        raise ConfigError("--mode single runs one process; use --mode tp with several processes (or --nproc 1)")
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // env.local_world))
    precision.configure(cfg.precision, env.device)
    if cfg.overlap and env.device.type == "cpu" and env.world > 1 and env.is_main:
        _warn_cpu_overlap(env.local_world * torch.get_num_threads())
    if env.is_main:  # only rank 0 writes: other nodes may not see its paths
        check_output_paths(cfg)
    data = load(cfg, env.world, env.rank) if load else _load_from_store(cfg, env)
    cfg = cfg.for_task(data.task_type)
    if getattr(data, "hetero", False):  # node types and relations: R-GCN (ntp.engine.tasks.hetero.task)
        from ntp.engine.tasks.hetero.task import setup_hetero

        return Job(**setup_hetero(cfg, env, data))
    if cfg.model == "rgcn":
        raise ConfigError(f"--model rgcn needs a heterogeneous store (node types and relations); {data.name!r} is "
                          "homogeneous: choose gcn, sage, gin, gat, sgc or appnp, or build the store from an OGB "
                          "heterogeneous folder")
    if data.task_type == "link":  # edge mini-batches, a decoder and ranking metrics (ntp.engine.tasks.link.task)
        from ntp.engine.tasks.link.task import setup_link

        return Job(**setup_link(cfg, env, data))
    y_all = torch.from_numpy(np.asarray(data.labels))
    train_count = count_train_labels(data.name, y_all, data.splits["train"])  # before a model of 0 outputs is built
    part = Partition(data.num_nodes, env.world, env.rank)
    check_same_on_all_ranks("graph (nodes, edges, feature width, classes)",
                            (data.num_nodes, data.num_edges, data.feature_dim, data.out_dim, cfg.to_json()))
    comm = Comm(part, env.device, group=None)
    width = placement.propagated_width(cfg.arch, cfg.hidden, data.out_dim)
    model = build_model(cfg, data.feature_dim, data.out_dim)
    placed = _place_nn_stage(cfg, env, data, model)
    nn_device = placed.home
    ctx_cls = DataParallelContext if cfg.mode == "data" else GraphContext
    ctx = ctx_cls(data.topology, comm, chunk_rows=cfg.chunk_rows, seed=cfg.seed, memory_budget=cfg.memory_budget_bytes,
                  overlap=cfg.overlap, offload=cfg.offload, width=width, nn_device=nn_device,
                  reserved=placed.reserved, precision=cfg.precision, row_block=placed.row_block)
    if env.is_main and cfg.offload == "all" and ctx.device.type == "cuda":
        print(f"[ntp] {placement.describe_streaming(ctx.column_block, ctx.slice_width, ctx.topology_offload == 'none')}",
              flush=True)
    model = model.to(env.device if placed.row_block else nn_device)  # streamed: the parameters stay on the device
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    r0, r1 = part.rows()
    local_split = {name: _local_labeled(data.splits[name], y_all, r0, r1) for name in SPLITS}
    x = torch.from_numpy(data.features).to(nn_device, precision.dtype(cfg.precision))
    if placed.row_block and env.device.type == "cuda":
        x = x.pin_memory()  # its blocks reach the device at the bus's speed, no staging copy
    return Job(cfg, env, data, comm, ctx, model, optimizer, x=x,
               y=y_all[r0:r1].to(nn_device), local_split={k: v.to(nn_device) for k, v in local_split.items()},
               global_train_count=train_count)


def _warn_cpu_overlap(busy_threads: int) -> None:
    cores = os.cpu_count() or 1
    if busy_threads >= cores:
        print(f"[ntp] warning: --overlap on CPU ranks that use all {cores} cores ({busy_threads} compute threads): "
              "gloo's communication is CPU work too, so it has nothing idle to overlap with and overlapping may be a "
              "few percent slower here (docs/benchmarks.md, section 6); it pays where a GPU or a network link "
              "moves the data", flush=True)


def _place_nn_stage(cfg: TrainConfig, env: DistEnv, data: GraphData,
                    model: torch.nn.Module) -> placement.NNPlacement:
    """Where a node classifier's NN stage runs, and what the model keeps on the rank's device besides aggregation
    (ntp.engine.memory.placement.place_nn_stage)."""
    # the preflight's figures (the largest row block), so every rank plans alike
    shape = dict(num_nodes=data.num_nodes, num_edges=data.num_edges, feature_dim=data.feature_dim,
                 out_dim=data.out_dim, world=env.world, params=sum(p.numel() for p in model.parameters()),
                 device_type=env.device.type, symmetric=data.topology.symmetric)
    resident = placement.rank_resident_parts(cfg, nn_on_device=True, **shape)
    reserved = {"NN stage": resident["NN stage"], **placement.attention_parts(cfg, data.num_nodes, data.num_edges)}
    return placement.place_nn_stage(cfg, env.device, resident, reserved, report=env.is_main,
                                    streamed=partial(placement.stream_parts, cfg, **shape) if cfg.nn_streams else None)


def _load_from_store(cfg: TrainConfig, env: DistEnv) -> GraphData:
    """This rank's data; the topology is built once per node and shared by its ranks (ntp.engine.graph.node_shared)."""
    if not cfg.store:
        raise ConfigError("no graph store given; pass --store PATH (build one with `ntp data prepare NAME`)")
    from storage import open_store

    store = open_store(cfg.store)
    meta = store.meta
    if meta.hetero:
        from ntp.engine.tasks.hetero.data import load_hetero

        return load_hetero(store, env.world, env.rank)
    share = partial(on_node, local_rank=env.local_rank, local_world=env.local_world, key=job_key(meta.fingerprint),
                    required_bytes=topology_bytes(meta.num_nodes, meta.num_edges))
    return load_rank_data(store, env.world, env.rank, share)


def count_train_labels(name: str, labels: torch.Tensor, train_ids: np.ndarray) -> int:
    """Labeled vertices of the train split; none is a ConfigError (the driver's preflight checks the same)."""
    ids = torch.from_numpy(np.asarray(train_ids, dtype=np.int64))
    count = int(labeled(labels[ids]).sum())
    if count == 0:
        raise ConfigError(f"graph {name!r} has no labeled training vertex: nothing to train on; give labels and "
                          "a train split when building the store (`ntp data prepare ... --labels FILE --splits DIR`)")
    return count


def labeled(y: torch.Tensor) -> torch.Tensor:
    """Which rows carry a label (class id >= 0, or a non-NaN task)."""
    return y >= 0 if y.dim() == 1 else ~torch.isnan(y).all(dim=1)


def _local_labeled(ids: np.ndarray, y_all: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    own = ids_t[(ids_t >= r0) & (ids_t < r1)]
    return own[labeled(y_all[own])] - r0
