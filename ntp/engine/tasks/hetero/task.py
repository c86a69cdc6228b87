"""Node classification on a heterogeneous graph with R-GCN (ntp.engine.tasks.base.Task): a rank's job, its epoch and
evaluation, and the launcher's preflight.

The loss is the global mean over the target type's labeled training nodes: each rank sums the losses of its own rows
of the target type and divides by the global count, so the gradients summed over ranks are the single-process ones.
Replicated parameters (Linear layers, relation weights, mixing scalars) have their gradients summed over ranks; the
column slices of embedding tables are each rank's own (never reduced), and so is their optimiser state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.device import precision
from ntp.engine.distributed.collectives import (
    Comm,
    all_gather_rows,
    all_reduce_gradients,
    check_same_on_all_ranks,
    gather,
)
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.distributed.partition import Partition
from ntp.engine.distributed.traffic import ALLREDUCE
from ntp.engine.memory.chunks import ChunkPlan
from ntp.engine.nn.layers import class_loss_sum
from ntp.engine.nn.rowwise_adam import RowwiseAdam
from ntp.engine.tasks.base import (
    SPLITS,
    Job,
    count_train_labels,
    make_optimizer,
    refuse_first_layer_decay,
    refuse_loss_monitor,
    refuse_section,
    refuse_split_and_metric,
    split_accuracy,
)
from ntp.engine.tasks.hetero.data import HeteroGraphData, load_hetero, load_relations
from ntp.engine.tasks.hetero.memory import plan_operators, summary
from ntp.engine.tasks.hetero.relations import HeteroContext
from ntp.engine.tasks.hetero.rgcn import build_rgcn, embedding_tables
from ntp.errors import ConfigError
from ntp.model_specs import MODELS


class _TableView:
    """What SlicedEmbedding.snapshot needs of a context: a gather and a communicator over the table's rows."""

    def __init__(self, comm: Comm, rows: int) -> None:
        self.comm = Comm(Partition(rows, comm.world, comm.rank), comm.device, comm.group)
        self.comm.stats, self.device = comm.stats, comm.device

    def from_graph(self, h: torch.Tensor, width: int) -> torch.Tensor:
        return gather(h, self.comm, width)


def _optimizer(cfg: TrainConfig, model: torch.nn.Module, comm: Comm) -> torch.optim.Optimizer:
    """Adam/AdamW; with --sparse-embeddings, row-wise (lazy) updates of the embedding tables (a row is touched when
    any rank's slice of it has a gradient)."""
    if not cfg.sparse_embeddings:
        return make_optimizer(cfg, model.parameters())
    if cfg.optimizer != "adam":
        raise ConfigError("--sparse-embeddings updates with a row-wise Adam: use --optimizer adam")
    sliced = {id(p) for p in model.sliced()}
    return RowwiseAdam(
        [
            {"params": [p for p in model.parameters() if id(p) not in sliced]},
            {"params": model.sliced(), "rowwise": True, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        touched=lambda mask: comm.all_reduce(mask.to(torch.int32), ALLREDUCE) > 0,
    )


class HeteroTask:
    """R-GCN on the target node type: one full-graph step an epoch, accuracy on each split."""

    kind = "hetero"
    exports = ("predictions", "embeddings")
    exports_hint = "an R-GCN model predicts its target type's nodes: use --export predictions or embeddings"

    def check(self, cfg: TrainConfig) -> None:
        if not cfg.model_spec.heterogeneous:
            models = " or ".join(name for name, spec in MODELS.items() if spec.heterogeneous)
            raise ConfigError(
                f"this store is heterogeneous (several node types and relations): --model {cfg.model} "
                f"handles one node and one edge type; use --model {models}"
            )
        refuse_section(cfg, "link", "heterogeneous (R-GCN)")
        refuse_loss_monitor(cfg, "heterogeneous (R-GCN)")
        refuse_split_and_metric(cfg, "heterogeneous (R-GCN)", "the target type's accuracy")
        refuse_first_layer_decay(cfg, "heterogeneous (R-GCN)")

    def load(self, cfg: TrainConfig, env: DistEnv, store: Any) -> HeteroGraphData:
        return load_hetero(store, env.world, env.rank)

    def build(self, cfg: TrainConfig, env: DistEnv, data: HeteroGraphData) -> Job:
        """The job that trains R-GCN on ``data``."""
        self.check(cfg)
        check_same_on_all_ranks(
            "heterogeneous graph (types, relations, features, classes)", (data.signature(), cfg.to_json())
        )
        target_part = Partition(data.counts[data.target], env.world, env.rank)
        comm = Comm(target_part, env.device, group=None)
        plans = None
        if cfg.memory_budget_bytes and not cfg.chunk_rows:  # an explicit --chunk-rows wins, as for homogeneous models
            plans = plan_operators(cfg, data.relations, data.counts, data.feature_dims, data.num_classes, env.world)
        hc = HeteroContext(
            data,
            comm,
            norm=cfg.rel_norm,
            chunk_rows=cfg.chunk_rows,
            seed=cfg.seed,
            plans=plans,
            precision=cfg.precision,
        )
        model = build_rgcn(cfg, hc, data.feature_dims, data.target, data.num_classes).to(env.device)
        optimizer = _optimizer(cfg, model, comm)
        for table in embedding_tables(model):  # checkpoints hold each whole table and its state: any world size
            table.track_optimizer(optimizer)
        y = torch.from_numpy(np.asarray(data.labels, np.int64))
        r0, r1 = target_part.rows()
        local = {}
        for name in SPLITS:
            ids = torch.from_numpy(np.asarray(data.splits[name], np.int64))
            ids = ids[(ids >= r0) & (ids < r1)]
            local[name] = (ids[y[ids] >= 0] - r0).to(env.device)
        count = count_train_labels(f"{data.name} (type {data.target})", y, data.splits["train"])
        x = {t: torch.from_numpy(f).to(env.device, precision.dtype(cfg.precision)) for t, f in data.features.items()}
        return Job(
            cfg,
            env,
            data,
            comm,
            hc,
            model,
            optimizer,
            x=x,
            y=y[r0:r1].to(env.device),
            local_split=local,
            global_train_count=count,
            task=self,
        )

    def train_epoch(self, job: Job, epoch: int) -> float:
        model, hc = job.model, job.ctx
        model.train()
        hc.step = epoch
        job.optimizer.zero_grad(set_to_none=True)
        logits = model(job.x, hc)
        rows = job.local_split["train"]
        loss = class_loss_sum(logits.index_select(0, rows), job.y[rows]) / job.global_train_count
        loss.backward()
        sliced = {id(p) for p in model.sliced()}
        all_reduce_gradients([p for p in model.parameters() if id(p) not in sliced], job.comm)
        job.optimizer.step()
        return float(job.comm.all_reduce(loss.detach().reshape(1).clone(), ALLREDUCE)[0])

    @torch.no_grad()
    def evaluate(self, job: Job, outputs: torch.Tensor | None = None) -> dict[str, float]:
        """Accuracy of the target type on each split, identical on every rank."""
        if outputs is None:
            job.model.eval()
            outputs = job.model(job.x, job.ctx)
        return split_accuracy(job, outputs.argmax(dim=1))

    def gather_state(self, job: Job, with_optimizer: bool = False) -> None:
        """Every embedding table whole (and its optimiser state), for the state the loop keeps or checkpoints."""
        for table in embedding_tables(job.model):
            table.snapshot(_TableView(job.comm, table.num_nodes), with_optimizer=with_optimizer)

    def output_rows(self, job: Job) -> Partition:
        """The target type's nodes (ids local to the type) whose rows this rank's logits are."""
        return Partition(job.data.counts[job.data.target], job.env.world, job.env.rank)

    def target_type(self, job: Job) -> str:
        return job.data.target

    def layer_rows(self, job: Job, output: Any) -> torch.Tensor:
        """A hidden layer's output holds every node type's rows: the target type's; the last layer's, only those."""
        return output[job.data.target] if isinstance(output, dict) else output

    def check_store(self, cfg: TrainConfig, store: Any) -> None:
        self.check(cfg)
        labels = torch.from_numpy(np.asarray(store.labels(), np.int64))
        count_train_labels(store.meta.name, labels, store.split("train"))
        if not any(r.get("reverse_of") for r in store.meta.hetero.get("relations", [])):
            print(
                f"[ntp] note: store {store.meta.name} has no reverse relations; R-GCN as its paper and PyG's "
                "example run it adds them: `ntp data prepare ... --add-reverse` (a node then hears the nodes it "
                "points to, not only those pointing at it)",
                flush=True,
            )

    def plan(self, cfg: TrainConfig, store: Any, world: int, device: str, mode: str) -> ChunkPlan | None:
        """R-GCN's plan every rank will compute (ntp.engine.tasks.hetero.memory), from the store's relations."""
        if not cfg.memory_budget_bytes or cfg.chunk_rows:
            return None
        types = store.meta.hetero["node_types"]
        plans = plan_operators(
            cfg,
            load_relations(store),
            {t["name"]: t["count"] for t in types},
            {t["name"]: t["feature_dim"] for t in types},
            store.meta.num_classes,
            world,
        )
        return summary(plans)


@torch.no_grad()
def target_logits(job: Any) -> torch.Tensor:
    """Logits of every node of the target type, on every rank (for metrics that need all predictions)."""
    job.model.eval()
    return all_gather_rows(job.model(job.x, job.ctx).contiguous(), job.comm, ALLREDUCE)
