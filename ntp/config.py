"""Typed training configuration: one object, validated, recorded with the results.

A config comes from command-line flags, a YAML/TOML file (``--config FILE``), or both (flags win): the driver
merges them (ntp.run.flags). Every check raises :class:`ConfigError` with a message that says how to fix the input.
How many processes run it, and where, is the launch spec's business (ntp.spec), not the config's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ntp.config_checks import validate
from ntp.errors import ConfigError
from ntp.model_specs import MODELS, ModelSpec, model_default, models_help
from ntp.options import (
    Arch,
    DecayLayers,
    Decoder,
    Decomposition,
    FitOn,
    JumpingKnowledge,
    MetricName,
    Mode,
    Model,
    Monitor,
    NNDevice,
    Norm,
    Offload,
    Optimizer,
    Precision,
    RelNorm,
    Schedule,
    load_config_file,
    parse_bytes,
)

#: --weight-decay left out: Kipf's GCN for node classifiers (and R-GCN), none for link prediction (OGB's examples)
WEIGHT_DECAY, LINK_WEIGHT_DECAY = 5e-4, 0.0
#: A config file's top-level key that training ignores: what a recipe (recipes/) reproduces and how its store is made.
RECIPE_KEY = "recipe"
#: Options of `ntp train` alone (it runs one job per split set and seed): a flow or `ntp pipeline` trains one job.
REPEAT_OPTIONS = ("splits", "seeds")
#: Keys of configs saved by older versions -> their names now.
RENAMED_KEYS = {"pipeline": "overlap", "timeout_s": "collective_timeout_s"}
#: Fields that steer how long a run goes, where it writes and how it spreads the work, not what an epoch computes
#: (up to rounding): they may change on --resume. The store is compared by fingerprint, not path.
RESUMABLE_CHANGES = frozenset(
    {
        "epochs",
        "results",
        "checkpoint_dir",
        "checkpoint_every",
        "model_out",
        "resume",
        "resume_anyway",
        "eval_every",
        "patience",
        "collective_timeout_s",
        "threads",
        "fail_at_epoch",
        "fail_rank",
        "chunk_rows",
        "memory_budget",
        "overlap",
        "offload",
        "nn_device",
        "nn_block_rows",
        "mode",
        "store",
        "splits",
        "seeds",
    }
)

#: Fields that say how inference runs on this hardware, not what the model computes: `ntp predict` and
#: `ntp evaluate` take them from their command line, the rest comes from the saved model's config.
INFERENCE_OPTIONS = (
    "chunk_rows",
    "memory_budget",
    "overlap",
    "offload",
    "nn_device",
    "nn_block_rows",
    "collective_timeout_s",
    "threads",
)

#: Fields that say how a job runs and where it writes, not what it computes: `ntp train --continue` of a --splits or
#: --seeds run takes them from this command, while every other field must be the one the stopped run was made with.
CONTINUABLE_CHANGES = frozenset(INFERENCE_OPTIONS) | {
    "mode",
    "results",
    "model_out",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
    "resume_anyway",
    "fail_at_epoch",
    "fail_rank",
}


#: The config's sections, in --help's order: name -> title. A field's section is in its metadata (:func:`opt`).
SECTIONS = {
    "data": "data",
    "gnn": "model",
    "optim": "optimisation",
    "parallel": "parallelism and memory",
    "link": "link prediction (link stores)",
    "rgcn": "R-GCN (heterogeneous stores)",
    "run": "run and outputs",
    "testing": "testing aids (not in --help)",
}


def opt(section: str, default: Any, help: str) -> Any:
    """A config field of ``section`` (:data:`SECTIONS`) with its --help text."""
    assert section in SECTIONS, section
    return field(default=default, metadata={"help": help, "section": section})


def section_of(name: str) -> str:
    """The section of the field ``name``."""
    return next(f.metadata["section"] for f in fields(TrainConfig) if f.name == name)


@dataclass(kw_only=True)
class TrainConfig:
    """Everything that defines a training run."""

    store: str = opt("data", "", "Path of the graph store (from `ntp data prepare`).")
    split: int = opt(
        "data",
        0,
        "Which split set of a store that holds several (e.g. the heterophilous benchmarks' ten, from "
        "`ntp data prepare --from-npz`): 0..sets-1.",
    )
    metric: MetricName | None = opt(
        "data",
        None,
        "Node classification's metric: acc or rocauc (one-vs-rest mean over classes; for 2 classes the "
        "positive class's ROC-AUC); empty: the store's (ROC-AUC for 2-class heterophilous benchmarks such as "
        "tolokers and questions, as Platonov et al. report them; OGB's own; accuracy otherwise).",
    )
    fit_on: FitOn = opt(
        "data",
        "train",
        "The splits whose labels the loss sees. train: the weights of the best validation epoch are kept. "
        "train+valid, as papers that tune on valid and then train on both (R-GCN's) report: nothing is held out "
        "to select on, so the last epoch's weights and test metric are kept and no validation metric is reported "
        "(not with --patience, --lr-schedule plateau or ntp sweep, which need one). Node and R-GCN stores.",
    )
    model: Model = opt("gnn", "gcn", f"The model ({models_help()})")
    arch: Arch = opt(
        "gnn",
        "decoupled",
        "decoupled: NN stage then propagation (4 all-to-all per epoch); coupled: classic GNN layers.",
    )
    mode: Mode | None = opt(
        "parallel",
        None,
        "single: one process, the reference; tp: tensor parallel; data: vertex-partitioned "
        "data parallel. Empty: single for one process, tp for several.",
    )
    epochs: int = opt("optim", 100, "Number of training epochs.")
    hidden: int = opt("gnn", 64, "Hidden width of the NN stage / GNN layers.")
    nn_layers: int = opt("gnn", 2, "Decoupled: Linear layers in the NN stage. Coupled: number of GNN layers.")
    prop_steps: int = opt("gnn", 2, "Decoupled: propagation steps after the NN stage (independent of nn_layers).")
    dropout: float = opt(
        "gnn", 0.5, "Dropout probability in the NN stage (masks do not depend on the number of workers)."
    )
    input_dropout: float | None = opt(
        "gnn",
        None,
        "Dropout on the first layer's input (the features, or the learned node "
        "embeddings); empty: --dropout, as Kipf's GCN. PyG's GCN/GraphSAGE models "
        "and OGB's link-prediction examples use 0.",
    )
    lr: float = opt("optim", 0.01, "Learning rate.")
    weight_decay: float | None = opt(
        "optim",
        None,
        "L2 weight decay (Adam) or decoupled decay (AdamW); empty: 5e-4 (Kipf's "
        "GCN), and 0 for link prediction (OGB's examples: under Adam, decay "
        "pulls learned node embeddings, whose gradients are small, to zero).",
    )
    weight_decay_layers: DecayLayers = opt(
        "optim",
        "all",
        "Which layers --weight-decay applies to: all, or first (the layer that reads the features, as Kipf & "
        "Welling's GCN and PyG's gcn.py example: the others are not decayed). Node classification only.",
    )
    optimizer: Optimizer = opt("optim", "adam", "adam or adamw.")
    lr_schedule: Schedule = opt(
        "optim",
        "none",
        "Learning-rate schedule after the warm-up, one step per epoch (torch.optim.lr_scheduler): none, cosine "
        "(CosineAnnealingLR to --min-lr at the last epoch) or plateau (ReduceLROnPlateau on the validation "
        "metric: x --plateau-factor after --plateau-patience evaluations without a better one).",
    )
    warmup_epochs: int = opt(
        "optim", 0, "Linear warm-up from lr/(N+1) to --lr over the first N epochs (LinearLR), then the schedule."
    )
    min_lr: float = opt("optim", 0.0, "Lowest learning rate of cosine and plateau schedules.")
    plateau_factor: float = opt("optim", 0.5, "plateau: factor the learning rate is multiplied by (0 < f < 1).")
    plateau_patience: int = opt("optim", 10, "plateau: evaluations without a better validation metric before a cut.")
    norm: Norm = opt(
        "gnn",
        "none",
        "Normalisation after each hidden layer (decoupled: the NN stage's Linears; coupled: the GNN layers, "
        "before their activation): none, batch (statistics over all rows of all ranks) or layer.",
    )
    residual: bool = opt(
        "gnn",
        False,
        "Coupled: add each GNN layer's input to its output, before the norm (a Linear projection where "
        "the widths differ, as the first layer's without --input-proj).",
    )
    jk: JumpingKnowledge = opt(
        "gnn",
        "none",
        "Coupled: jumping knowledge. none: the last GNN layer predicts the classes; otherwise every "
        "layer is hidden-wide (norm, activation, dropout) and a Linear head predicts from the last "
        "layer's output (last), or all layers' summed (sum, tunedGNN's), concatenated (cat) or "
        "element-wise max (max), as PyG's jk.",
    )
    input_proj: bool = opt(
        "gnn",
        False,
        "Coupled: a Linear projection of the (input-dropped) features to --hidden before the first "
        "GNN layer, followed by --dropout (tunedGNN's pre_linear).",
    )
    alpha: float = opt("gnn", 0.1, "APPNP teleport probability.")
    heads: int = opt("gnn", 4, "GAT attention heads.")
    seed: int = opt("optim", 0, "Seed for parameters, dropout and anything random.")
    eval_every: int = opt("optim", 1, "Evaluate train/valid/test every N epochs (and at the last epoch).")
    patience: int = opt(
        "optim", 0, "Early stopping: stop after this many evaluations without a better --monitor (0: off)."
    )
    monitor: Monitor = opt(
        "optim",
        "metric",
        "What picks the epoch whose weights and test metric are kept, and what --patience watches: the validation "
        "metric (higher is better), or the validation loss (lower is better; node classification), as Shchur et "
        "al.'s benchmark selects. --lr-schedule plateau watches the metric either way.",
    )
    splits: str = opt(
        "run",
        "",
        "Train once per split set and report mean +- std: all, or a comma list (e.g. 0,1,2); one MLflow parent "
        "run with a child per split. Empty: the one --split.",
    )
    seeds: int = opt(
        "run",
        0,
        "Train with seeds --seed .. --seed+N-1 (on each split of --splits) and report mean +- std, one MLflow "
        "child per run (0: one run).",
    )
    results: str | None = opt(
        "run", None, "JSON-lines results file written by rank 0 (one record per epoch, then a final record)."
    )
    checkpoint_dir: str | None = opt(
        "run",
        None,
        "Directory for checkpoints (written atomically; a new run needs one without checkpoints). With "
        "--splits/--seeds, a folder PARENT_RUN_ID/splitK-seedS per job: --continue resumes the stopped one there.",
    )
    checkpoint_every: int = opt("run", 10, "Write a checkpoint every N epochs (needs checkpoint_dir).")
    model_out: str | None = opt(
        "run", None, "Where rank 0 saves the best model (weights + config) at the end of training."
    )
    resume: bool = opt("run", False, "Continue from the latest checkpoint in checkpoint_dir.")
    resume_anyway: bool = opt(
        "run",
        False,
        "With --resume: continue even if the checkpoint was written with other options "
        "(lr, model, ...) or on another store; the new options apply from now on.",
    )
    chunk_rows: int = opt(
        "parallel", 0, "Destination rows per aggregation chunk (0: from --memory-budget, else one chunk)."
    )
    memory_budget: str = opt(
        "parallel",
        "",
        "Memory of one rank, e.g. 8GB or 512MB: what stays resident (topology, embeddings, NN "
        "stage) plus one aggregation chunk; chunks are the largest that fit in the rest "
        "(default: free GPU memory with a margin; chunks of 256 MiB on CPU).",
    )
    overlap: bool = opt(
        "parallel",
        False,
        "Tensor parallel: split and gather chunk by chunk as asynchronous collectives that "
        "overlap aggregation (inter-chunk pipelining); a source row is sent once. Not for gat.",
    )
    precision: Precision = opt(
        "parallel",
        "fp32",
        "fp32, or bf16: features, activations, communication and aggregation in "
        "bfloat16, with float32 sums, parameters and optimiser state (half the "
        "activation memory and traffic; fp32 is the exactness reference). Link "
        "prediction: its encoder (the decoder scores in float32).",
    )
    offload: Offload = opt(
        "parallel",
        "none",
        "What aggregation keeps in host memory: none, topology (streamed to the device "
        "chunk by chunk, each chunk's copy beside the last one's compute; 1.12x the "
        "in-device epoch on an H100 at 120M edges), or all (the topology, and the "
        "column-slice embeddings too, in pinned memory, where the device cannot hold them "
        "beside a chunk of the topology: each product then copies them through the device "
        "in column blocks; docs/memory.md).",
    )
    nn_device: NNDevice = opt(
        "parallel",
        "auto",
        "Where the NN stage runs: device (the rank's GPU); stream (its rows in host "
        "memory, computed on the GPU a block of rows at a time and recomputed in the "
        "backward); cpu (on the host); or auto (device when its rows fit beside "
        "aggregation's, else stream). Not gat, rgcn or --norm batch for stream; link "
        "prediction streams its encoder.",
    )
    nn_block_rows: int = opt(
        "parallel",
        0,
        "Rows of a block of the streamed NN stage (--nn-device stream; 0: from the memory "
        "budget or the free device memory).",
    )
    decoder: Decoder = opt(
        "link",
        "mlp",
        "Link prediction: how an edge (u, v) is scored from the node embeddings: mlp (OGB's "
        "LinkPredictor on h_u * h_v) or dot (h_u . h_v).",
    )
    decoder_layers: int = opt("link", 2, "Link prediction: Linear layers of the mlp decoder (hidden width: --hidden).")
    link_batch: int = opt(
        "link",
        65536,
        "Link prediction: positive training edges per step, with as many uniform negative "
        "pairs; every step reruns the encoder on the whole graph (as OGB's full-graph examples).",
    )
    clip_grad: float = opt(
        "link",
        0.0,
        "Clip the gradient norms of the node embeddings, the encoder and the decoder, each to "
        "this value (0: off; OGB's link-prediction examples use 1.0).",
    )
    rel_norm: RelNorm = opt(
        "rgcn",
        "mean",
        "R-GCN: how each relation's messages are normalised: mean (1/|N_r(v)|, PyG's "
        "RGCNConv), total (1/sum over relations of |N_r(v)|) or sum (none).",
    )
    decomposition: Decomposition = opt(
        "rgcn",
        "none",
        "R-GCN (coupled): relation weights as they are (none), a combination "
        "of --num-bases shared bases (basis) or --num-bases diagonal blocks "
        "(block: widths divisible by it).",
    )
    sparse_embeddings: bool = opt(
        "rgcn",
        False,
        "R-GCN: update embedding tables row-wise (lazy Adam: a row without a "
        "gradient keeps its value and moments, as DGL's SparseAdam); no weight decay "
        "on them.",
    )
    num_bases: int = opt("rgcn", 0, "R-GCN: bases (basis) or blocks (block) of the relation weights (0: none).")
    collective_timeout_s: float = opt(
        "parallel", 300.0, "Timeout of every collective, in seconds; a rank that waits longer fails the job."
    )
    threads: int = opt("parallel", 0, "Intra-op threads per rank (0: cores / ranks on this node).")
    fail_at_epoch: int = opt("testing", -1, "Testing aid: this rank fails (raises) at this epoch; see fail_rank.")
    fail_rank: int = opt("testing", -1, "Testing aid: the rank that fails at fail_at_epoch (-1: none).")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ntp.config_checks.validate: a ConfigError naming the option and its fix."""
        validate(self)

    def checkpoint_due(self, epoch: int) -> bool:
        """Whether the loop writes a checkpoint after ``epoch`` (it gathers sliced state for it in that epoch)."""
        return bool(self.checkpoint_dir) and ((epoch + 1) % self.checkpoint_every == 0 or epoch == self.epochs - 1)

    @property
    def model_spec(self) -> ModelSpec:
        """What the chosen model can do (ntp.model_specs)."""
        return MODELS[self.model]

    @property
    def holds_out_valid(self) -> bool:
        """Whether the valid split is held out of the loss (--fit-on train): then it selects the weights kept."""
        return self.fit_on == "train"

    @property
    def nn_streams(self) -> bool:
        """Whether the NN stage can stream in row blocks (ntp.engine.parallel.row_stream): its work is row-wise
        (no attention or relations) and needs no statistics over all rows (--norm batch)."""
        return self.model_spec.row_wise and self.norm != "batch"

    @property
    def classic_options(self) -> list[str]:
        """The coupled layers' options beyond the plain stack that are set (residual, jumping knowledge, input
        projection, normalisation): ntp.engine.nn.models.CoupledGNN builds them."""
        chosen = {
            "--residual": self.residual,
            f"--jk {self.jk}": self.jk != "none",
            "--input-proj": self.input_proj,
            f"--norm {self.norm}": self.norm != "none" and self.arch == "coupled",
        }
        return [name for name, on in chosen.items() if on]

    @property
    def first_dropout(self) -> float:
        """Dropout on the first layer's input: --input-dropout, or --dropout when it is not given."""
        return self.dropout if self.input_dropout is None else self.input_dropout

    def for_task(self, task_type: str) -> TrainConfig:
        """This config with the defaults that depend on the store's task (``task_type``: "link" for link prediction,
        else a classifier's) filled in: --weight-decay. A job's config (what checkpoints and saved models hold) is
        resolved so."""
        if self.weight_decay is not None:
            return self
        return self.replace(weight_decay=LINK_WEIGHT_DECAY if task_type == "link" else WEIGHT_DECAY)

    @property
    def memory_budget_bytes(self) -> int:
        """``memory_budget`` in bytes (0: not given)."""
        return parse_bytes(self.memory_budget, "--memory-budget")

    def section(self, name: str) -> dict[str, Any]:
        """The options of section ``name`` (:data:`SECTIONS`) and their values."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["section"] == name}

    def changed(self, section: str) -> list[str]:
        """The options of ``section`` set away from their defaults."""
        return [k for k, v in self.section(section).items() if v != self.default_of(k)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        clean = {k.replace("-", "_"): v for k, v in _flattened(data).items()}
        clean = {RENAMED_KEYS.get(k, k): v for k, v in clean.items()}
        if isinstance(clean.get("offload"), bool):  # saved before offload had levels: True meant the topology
            clean["offload"] = "topology" if clean["offload"] else "none"
        unknown = sorted(set(clean) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys {unknown}; valid keys: {', '.join(sorted(known))}")
        spec = MODELS.get(clean.get("model", cls.__dataclass_fields__["model"].default))
        return cls(**{**(spec.defaults if spec else {}), **clean})  # the model's defaults where nothing was given

    def default_of(self, name: str) -> Any:
        """Option ``name``'s default for this config's model (ntp.model_specs.ModelSpec.defaults)."""
        return model_default(self.model, name, TrainConfig.__dataclass_fields__[name].default)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> "TrainConfig":
        return cls.from_dict({**load_config_file(path), **overrides})


def _flattened(data: dict[str, Any]) -> dict[str, Any]:
    """A config as flat keys: a file may group them by section (``link: {decoder: dot}``; :data:`SECTIONS`), and a
    key must then be in its own section."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == RECIPE_KEY:  # a recipe's description (recipes/README.md), not an option
            continue
        if not (isinstance(value, dict) and key in SECTIONS):
            flat[key] = value
            continue
        for name, v in value.items():
            name = RENAMED_KEYS.get(name.replace("-", "_"), name.replace("-", "_"))
            own = next((f.metadata["section"] for f in fields(TrainConfig) if f.name == name), None)
            if own is not None and own != key:
                raise ConfigError(
                    f"config key {name!r} is in section {key!r}; it belongs to section {own!r}: "
                    f"move it there (or write it at the top level)"
                )
            flat[name] = v
    return flat
