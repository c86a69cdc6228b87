"""Node classification inside a rank (and before launch): one full-graph step per epoch over the labeled training
vertices of every rank, multi-class (cross-entropy, accuracy) or multi-task binary (BCE, ROC-AUC)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ntp.config import TrainConfig
from ntp.engine.device import precision
from ntp.engine.distributed.collectives import Comm, all_reduce_gradients, check_same_on_all_ranks
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.distributed.partition import Partition
from ntp.engine.distributed.traffic import ALLREDUCE
from ntp.engine.graph.data import GraphData, load_shared
from ntp.engine.memory import offload, parts, placement
from ntp.engine.memory.chunks import ChunkPlan
from ntp.engine.nn.layers import class_losses
from ntp.engine.nn.models import build_model
from ntp.engine.parallel.context import GraphContext
from ntp.engine.parallel.data_parallel import DataParallelContext
from ntp.engine.tasks.base import (
    SPLITS,
    Job,
    count_train_labels,
    decay_groups,
    labeled,
    make_optimizer,
    refuse_section,
    split_accuracy,
)
from ntp.engine.tasks.evaluation import compute_metric
from ntp.errors import ConfigError
from ntp.model_specs import MODELS


class NodeTask:
    kind = "node"
    exports = ("predictions", "embeddings")
    exports_hint = "a node classifier predicts nodes: use --export predictions or embeddings (--export scores is for link prediction models)"

    def check(self, cfg: TrainConfig) -> None:
        if cfg.model_spec.heterogeneous:
            models = ", ".join(name for name, spec in MODELS.items() if not spec.heterogeneous)
            raise ConfigError(
                f"--model {cfg.model} needs a heterogeneous store (node types and relations); this one "
                f"is homogeneous: choose {models}, or build the store from an OGB heterogeneous folder"
            )
        refuse_section(cfg, "link", "node classification on a homogeneous graph")
        refuse_section(cfg, "rgcn", "node classification on a homogeneous graph")

    def load(self, cfg: TrainConfig, env: DistEnv, store: Any) -> GraphData:
        data = load_shared(store, env, _checked_split(cfg, store))
        if cfg.metric is not None:
            data.metric = cfg.metric
        return data

    def build(self, cfg: TrainConfig, env: DistEnv, data: GraphData) -> Job:
        self.check(cfg)
        y_all = torch.from_numpy(np.asarray(data.labels))
        train_count = count_train_labels(data.name, y_all, data.splits["train"])  # before a model of 0 outputs
        part = Partition(data.num_nodes, env.world, env.rank)
        check_same_on_all_ranks(
            "graph (nodes, edges, feature width, classes)",
            (data.num_nodes, data.num_edges, data.feature_dim, data.out_dim, cfg.to_json()),
        )
        comm = Comm(part, env.device, group=None)
        width = parts.propagated_width(cfg.arch, cfg.hidden, data.out_dim)
        model = build_model(cfg, data.feature_dim, data.out_dim)
        placed = _place_nn_stage(cfg, env, data, model)
        nn_device = placed.home
        ctx_cls = DataParallelContext if cfg.mode == "data" else GraphContext
        ctx = ctx_cls(
            data.topology,
            comm,
            chunk_rows=cfg.chunk_rows,
            seed=cfg.seed,
            memory_budget=cfg.memory_budget_bytes,
            overlap=cfg.overlap,
            offload=cfg.offload,
            width=width,
            nn_device=nn_device,
            reserved=placed.reserved,
            precision=cfg.precision,
            row_block=placed.row_block,
        )
        if env.is_main and cfg.offload == "all" and ctx.device.type == "cuda":
            print(
                f"[ntp] {offload.describe_streaming(ctx.column_block, ctx.slice_width, ctx.topology_offload == 'none')}",
                flush=True,
            )
        model = model.to(env.device if placed.row_block else nn_device)  # streamed: the parameters stay on the device
        r0, r1 = part.rows()
        local_split = {name: _local_labeled(data.splits[name], y_all, r0, r1).to(nn_device) for name in SPLITS}
        x = torch.from_numpy(data.features).to(placed.features, precision.dtype(cfg.precision))
        if placed.row_block and env.device.type == "cuda" and not x.is_cuda:
            x = x.pin_memory()  # its blocks reach the device at the bus's speed, no staging copy
        return Job(
            cfg,
            env,
            data,
            comm,
            ctx,
            model,
            make_optimizer(cfg, decay_groups(cfg, model)),
            x=x,
            y=y_all[r0:r1].to(nn_device),
            local_split=local_split,
            global_train_count=train_count,
            task=self,
        )

    def train_epoch(self, job: Job, epoch: int) -> float:
        job.model.train()
        job.ctx.step = epoch
        job.optimizer.zero_grad(set_to_none=True)
        loss = job.model(job.x, job.ctx, TrainLosses(job))  # this rank's part of the mean
        loss.backward()
        all_reduce_gradients(list(job.model.parameters()), job.comm)
        job.optimizer.step()
        total = job.comm.all_reduce(loss.detach().reshape(1).clone(), ALLREDUCE)
        return float(total[0])

    @torch.no_grad()
    def evaluate(self, job: Job, outputs: torch.Tensor | None = None) -> dict[str, float]:
        if outputs is None:
            job.model.eval()
            outputs = job.model(job.x, job.ctx)
        metrics = split_metrics(job, outputs)
        if job.cfg.monitor == "loss":
            metrics["valid_loss"] = valid_loss(job, outputs)
        return metrics

    def gather_state(self, job: Job, with_optimizer: bool = False) -> None:
        """Nothing to gather: every rank holds the whole of each parameter."""

    def output_rows(self, job: Job) -> Partition:
        return Partition(job.data.num_nodes, job.env.world, job.env.rank)

    def target_type(self, job: Job) -> str:
        return ""

    def layer_rows(self, job: Job, output: torch.Tensor) -> torch.Tensor:
        return output

    def check_store(self, cfg: TrainConfig, store: Any) -> None:
        self.check(cfg)
        train = store.split("train", _checked_split(cfg, store))
        count_train_labels(store.meta.name, torch.from_numpy(store.labels()), train)
        if cfg.metric == "rocauc" and store.meta.task_type == "multiclass" and store.meta.num_classes < 2:
            raise ConfigError("--metric rocauc ranks two or more classes; this store has one: use --metric acc")

    def plan(self, cfg: TrainConfig, store: Any, world: int, device: str, mode: str) -> ChunkPlan | None:
        if not cfg.memory_budget_bytes or cfg.chunk_rows or mode == "data":
            return None
        meta = store.meta
        out_dim = meta.num_classes if meta.task_type == "multiclass" else meta.num_tasks
        params = sum(p.numel() for p in build_model(cfg, meta.feature_dim, out_dim).parameters())
        shape = dict(
            num_nodes=meta.num_nodes,
            num_edges=meta.num_edges,
            feature_dim=meta.feature_dim,
            out_dim=out_dim,
            world=world,
            params=params,
            device_type=device,
            symmetric=bool(meta.preprocessing.get("symmetrized")),
        )
        if cfg.nn_device == "stream":  # the ranks size the blocks from the budget alike
            resident = parts.stream_parts(cfg, room=cfg.memory_budget_bytes, **shape)[1]
        else:  # on a GPU, "auto" may move the NN stage off the device; the ranks decide (and check) that themselves
            resident = parts.rank_resident_parts(
                cfg, nn_on_device=device == "cpu" or cfg.nn_device == "device", **shape
            )
        return placement.store_plan(cfg, store, world, device, resident, out_dim)


def _checked_split(cfg: TrainConfig, store: Any) -> int:
    """--split, when the store holds that split set (a ConfigError naming the choices otherwise)."""
    from storage.schema import split_sets

    sets = split_sets(store.meta.split_names)
    if cfg.split >= sets:
        raise ConfigError(
            f"--split {cfg.split}: store {store.meta.name} holds {sets} split set(s); choose 0..{sets - 1}"
            + ("" if sets > 1 else " (stores from `ntp data prepare --from-npz` hold several)")
        )
    return cfg.split


def _place_nn_stage(cfg: TrainConfig, env: DistEnv, data: GraphData, model: torch.nn.Module) -> placement.NNPlacement:
    """Where the NN stage runs, and what the model keeps on the rank's device besides aggregation
    (ntp.engine.memory.placement.place_nn_stage)."""
    # the preflight's figures (the largest row block), so every rank plans alike
    shape = dict(
        num_nodes=data.num_nodes,
        num_edges=data.num_edges,
        feature_dim=data.feature_dim,
        out_dim=data.out_dim,
        world=env.world,
        params=sum(p.numel() for p in model.parameters()),
        device_type=env.device.type,
        symmetric=data.topology.symmetric,
    )
    resident = parts.rank_resident_parts(cfg, nn_on_device=True, **shape)
    reserved = {"NN stage": resident["NN stage"], **parts.attention_parts(cfg, data.num_nodes, data.num_edges)}
    slice_width = parts.rank_slice_width(cfg, data.out_dim, env.world)  # GraphContext's
    return placement.place_nn_stage(
        cfg,
        env.device,
        resident,
        reserved,
        report=env.is_main,
        streamed=partial(parts.stream_parts, cfg, **shape) if cfg.nn_streams else None,
        feature_bytes=placement.feature_bytes(data.num_nodes, data.feature_dim, env.world, cfg.precision),
        bus=partial(offload.offload_bus_bytes, data.topology, slice_width, cfg.precision),
    )


class TrainLosses:
    """Each of a rank's rows' part of the training loss (its loss over the training vertices of all ranks; 0 off
    them), as a tail of the model (ntp.engine.nn.models.GraphModel.forward): ``(position, logits) -> (rows, 1)`` for
    the rows from ``position.row_offset`` on, all of the rank's or, where the model streams, one block's on the
    device (the logits' rows are then never whole in host memory). Summed over all ranks, the epoch's mean loss: its
    gradient is 1, so a streamed model's last segment returns the gradients it took in the forward as they are."""

    def __init__(self, job: Job) -> None:
        self.first = job.ctx.row_offset
        self.train = job.local_split["train"]  # sorted (_local_labeled): a block's are a contiguous run
        self.y, self.multiclass = job.y, job.data.task_type == "multiclass"
        self.count = job.global_train_count
        self._copies: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, position: Any, logits: torch.Tensor) -> torch.Tensor:
        a = position.row_offset - self.first
        bounds = torch.tensor([a, a + logits.shape[0]], device=self.train.device)
        lo, hi = torch.searchsorted(self.train, bounds).tolist()  # where the rows live: no GPU waited for, streamed
        train, y = self._on(logits.device)
        rows = train[lo:hi]
        at = rows - a
        # picked with index_select: the backward of ``logits[rows]`` is an accumulating ``index_put_``, 10x slower on
        # two CPU threads
        losses = row_losses(logits.index_select(0, at), y[rows], self.multiclass) / self.count
        return logits.new_zeros(logits.shape[0]).index_put((at,), losses)[:, None]

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The training rows and the labels on ``device``, copied there once: a streamed block's copy up would wait
        for the GPU to finish all its queued work (torch's blocking copy synchronises), twice a block."""
        if device not in self._copies:
            self._copies[device] = (self.train.to(device), self.y.to(device))
        return self._copies[device]


def row_losses(logits: torch.Tensor, y: torch.Tensor, multiclass: bool) -> torch.Tensor:
    """Each row's loss: cross-entropy, or the binary cross-entropy summed over the tasks it is labelled for."""
    if multiclass:
        return class_losses(logits, y)
    labelled = ~torch.isnan(y)
    bce = F.binary_cross_entropy_with_logits(logits, torch.nan_to_num(y), reduction="none")
    return torch.where(labelled, bce, 0.0).sum(dim=1)


def valid_loss(job: Job, logits: torch.Tensor) -> float:
    """The training loss over the valid split's labelled rows (their mean), from this rank's rows of ``logits``
    (every rank gets the same number)."""
    rows = job.local_split["valid"]
    y = job.y[rows].to(logits.device)
    losses = row_losses(logits.index_select(0, rows.to(logits.device)).float(), y, job.data.task_type == "multiclass")
    total = torch.stack([losses.sum().double(), torch.tensor(float(len(rows)), dtype=torch.float64)])
    loss_sum, count = job.comm.all_reduce(total.to(job.comm.device), ALLREDUCE).tolist()
    return loss_sum / count if count else float("nan")


def split_metrics(job: Job, logits: torch.Tensor) -> dict[str, float]:
    """The metric on train/valid/test of this rank's rows of ``logits`` (every rank gets the same numbers)."""
    if job.data.metric == "acc" and job.data.task_type == "multiclass":
        return split_accuracy(job, logits.argmax(dim=1))
    return _gathered_metric(job, logits)


def _gathered_metric(job: Job, logits: torch.Tensor) -> dict[str, float]:
    """ROC-AUC (and OGB's evaluator) need every score: gather them to every rank, which then all compute the
    metric of the same numbers as one process would."""
    multiclass = job.data.task_type == "multiclass"
    scores = torch.softmax(logits.float(), dim=1) if multiclass else torch.sigmoid(logits)
    full = job.comm.all_gather_rows(scores.to(job.comm.device).contiguous(), ALLREDUCE).cpu().numpy()
    labels = np.asarray(job.data.labels)
    out = {}
    for name in SPLITS:
        ids = np.asarray(job.data.splits[name], dtype=np.int64)
        ids = ids[labels[ids] >= 0] if multiclass else ids
        y, pred = labels[ids], full[ids]
        if job.data.metric == "acc":
            pred = pred.argmax(1)
        ogb = job.data.ogb_name if job.data.metric == job.data.meta.get("metric") else None  # not under --metric
        out[name] = compute_metric(job.data.metric, y, pred, ogb)
    return out


def _local_labeled(ids: np.ndarray, y_all: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """The labelled ids of a split in rows r0..r1, local and sorted."""
    ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    own = ids_t[(ids_t >= r0) & (ids_t < r1)].sort().values
    return own[labeled(y_all[own])] - r0
