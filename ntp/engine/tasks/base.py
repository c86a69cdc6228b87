"""What every task shares: the job one rank trains with, and the protocol a task implements.

A task (node classification, link prediction, heterogeneous R-GCN) is chosen once, from the store's kind
(:func:`ntp.engine.tasks.task_for`); setup, the loop, inference and the launcher's preflight then call its methods and
never branch on the task themselves. Adding a task is a new package here that implements :class:`Task`, and one line
in ``task_for``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ntp.config import SECTIONS, TrainConfig
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.distributed.partition import Partition
from ntp.errors import ConfigError
from ntp.options import flag
from ntp.records import EpochRecord

if TYPE_CHECKING:
    from ntp.engine.memory.chunks import ChunkPlan

SPLITS = ("train", "valid", "test")


@dataclass
class Best:
    """The evaluation whose weights the run keeps so far (the best validation epoch; the last one evaluated under
    --fit-on train+valid), and those weights."""

    epoch: int = -1
    valid: float = float("-inf")
    test: float | None = None
    valid_loss: float = float("inf")  #: under --monitor loss
    state: dict | None = None


@dataclass
class Job:
    """Everything one rank trains with; ``task`` made it and runs its epochs and evaluations."""

    cfg: TrainConfig
    env: DistEnv
    data: Any  #: the task's data (ntp.engine.graph.data.GraphData or the task's own)
    comm: Comm
    ctx: Any  #: the task's context (ntp.engine.parallel.context.GraphContext, or R-GCN's HeteroContext)
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: Any  #: this rank's feature rows (R-GCN: by node type)
    y: torch.Tensor  #: labels of this rank's rows (empty for link prediction)
    local_split: dict[str, torch.Tensor]  #: split name -> local row ids of labeled vertices in the split
    global_train_count: int  #: what the loss is averaged over on all ranks (labeled vertices, positive edges)
    task: Task
    best: Best = field(default_factory=Best)
    schedule: Any = None  #: the learning-rate schedule (ntp.engine.train.schedule.Schedule), made by the loop
    history: list[EpochRecord] = field(default_factory=list)  #: epoch records (rank 0 writes them)


class Task(Protocol):
    """One kind of learning problem, as a rank's job and the launcher's preflight see it."""

    #: "node", "link" or "hetero"
    kind: str
    #: what ``ntp predict --export`` can write for this task's models, and how to choose when asked for another
    exports: tuple[str, ...]
    exports_hint: str

    def check(self, cfg: TrainConfig) -> None:
        """Refuse options this task does not take (ConfigError naming the fix); before launch and in every rank."""

    def load(self, cfg: TrainConfig, env: DistEnv, store: Any) -> Any:
        """This rank's data from an opened store."""

    def build(self, cfg: TrainConfig, env: DistEnv, data: Any) -> Job:
        """The job: context, model, optimiser, this rank's rows, with ``task=self``."""

    def train_epoch(self, job: Job, epoch: int) -> float:
        """Forward, backward and update(s); the global mean loss, the same on every rank."""

    def evaluate(self, job: Job, outputs: torch.Tensor | None = None) -> dict[str, float]:
        """The metric on train/valid/test, the same on every rank (``outputs``: this rank's model outputs, when the
        caller has them already)."""

    def gather_state(self, job: Job, with_optimizer: bool = False) -> None:
        """Make ``job.model.state_dict()`` whole, and ``job.optimizer.state_dict()`` too ``with_optimizer``: a
        collective the loop calls on every rank before it keeps, checkpoints or saves a state, and only then (it
        moves every sliced table)."""

    def output_rows(self, job: Job) -> Partition:
        """The nodes whose rows this rank's model outputs cover (ids local to the target type for R-GCN)."""

    def target_type(self, job: Job) -> str:
        """The node type the metrics and predictions are about ("" on a homogeneous graph)."""

    def layer_rows(self, job: Job, output: Any) -> torch.Tensor:
        """This rank's rows of :meth:`output_rows` in a layer's ``output`` (embeddings)."""

    def check_store(self, cfg: TrainConfig, store: Any) -> None:
        """Before launch: the options and what the store must hold for this task (ConfigError naming the fix)."""

    def plan(self, cfg: TrainConfig, store: Any, world: int, device: str, mode: str) -> ChunkPlan | None:
        """Before launch: the chunk plan an explicit ``--memory-budget`` gives on ``world`` ranks of ``device``
        (MemoryPlanError when it cannot work); None where the ranks plan alone."""


def make_optimizer(cfg: TrainConfig, params: Any) -> torch.optim.Optimizer:
    """Adam or AdamW (--optimizer) over ``params`` (parameters or parameter groups)."""
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return opt_cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def decay_groups(cfg: TrainConfig, model: torch.nn.Module) -> Any:
    """``model``'s parameters for :func:`make_optimizer` under --weight-decay-layers: all decayed alike, or only
    those of its first layer (``model.first_layer()``), the rest in a group without decay."""
    if cfg.weight_decay_layers == "all":
        return model.parameters()
    first = {id(p) for p in model.first_layer().parameters()}
    params = list(model.parameters())
    return [
        {"params": [p for p in params if id(p) in first]},
        {"params": [p for p in params if id(p) not in first], "weight_decay": 0.0},
    ]


def refuse_first_layer_decay(cfg: TrainConfig, store_kind: str) -> None:
    """--weight-decay-layers first picks a node classifier's first layer; other tasks' models decay every parameter,
    so the option is an error there, not ignored."""
    if cfg.weight_decay_layers != "all":
        raise ConfigError(
            f"--weight-decay-layers {cfg.weight_decay_layers}: node classifiers only; this store is {store_kind}, "
            "whose models decay every parameter: drop it"
        )


def split_accuracy(job: Job, pred: torch.Tensor) -> dict[str, float]:
    """Accuracy of this rank's predicted classes on each split's labeled rows, summed over ranks (the same on
    every rank)."""
    counts = torch.tensor(
        [[float((pred[r] == job.y[r]).sum()), float(len(r))] for r in job.local_split.values()],
        dtype=torch.float64,
        device=pred.device,
    )
    counts = job.comm.all_reduce(counts)
    return {name: float(c / t) if t else float("nan") for name, (c, t) in zip(SPLITS, counts.tolist())}


def count_train_labels(name: str, labels: torch.Tensor, train_ids: np.ndarray) -> int:
    """Labeled vertices of the train split; none is a ConfigError (the driver's preflight checks the same)."""
    ids = torch.from_numpy(np.asarray(train_ids, dtype=np.int64))
    count = int(labeled(labels[ids]).sum())
    if count == 0:
        raise ConfigError(
            f"graph {name!r} has no labeled training vertex: nothing to train on; give labels and "
            "a train split when building the store (`ntp data prepare ... --labels FILE --splits DIR`)"
        )
    return count


def labeled(y: torch.Tensor) -> torch.Tensor:
    """Which rows carry a label (class id >= 0, or a non-NaN task)."""
    return y >= 0 if y.dim() == 1 else ~torch.isnan(y).all(dim=1)


def refuse_split_and_metric(cfg: TrainConfig, store_kind: str, metric: str) -> None:
    """--split and --metric choose among a node store's split sets and metrics; this task's store has one split set
    and its own metric, so setting them is an error, not ignored."""
    changed = [name for name in ("split", "metric") if name in cfg.changed("data")]
    if changed:
        flags = ", ".join(f"--{flag(name)}" for name in changed)
        raise ConfigError(
            f"{flags}: this store is {store_kind}, with one split set and {metric} as its metric: drop them"
        )


def refuse_loss_monitor(cfg: TrainConfig, store_kind: str) -> None:
    """--monitor loss selects node classifiers by their validation loss; this task selects by its metric."""
    if cfg.monitor == "loss":
        raise ConfigError(f"--monitor loss is for node classification; this store is {store_kind}: drop it")


def refuse_section(cfg: TrainConfig, section: str, store_kind: str) -> None:
    """Options of another task's section (ntp.config.SECTIONS) set on this task's store are an error, not ignored."""
    changed = cfg.changed(section)
    if changed:
        flags = ", ".join(f"--{flag(name)}" for name in changed)
        raise ConfigError(f"{flags}: options of {SECTIONS[section]}; this store is {store_kind}: drop them")
