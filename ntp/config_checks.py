"""The checks of a TrainConfig, in one place: choices, ranges, and options the chosen model, architecture or mode
would ignore (an error, not a silent no-op); each message names the fix. Options that depend on the store's task
are the task's own checks (ntp.engine.tasks)."""

from __future__ import annotations

from dataclasses import fields

from ntp.errors import ConfigError
from ntp.model_specs import MODELS
from ntp.options import flag, literal_choices, parse_bytes


def validate(cfg) -> None:  # noqa: ANN001 (a TrainConfig)
    """Every check of one config: a ConfigError naming the option and its fix."""
    for f in fields(cfg):
        choices = literal_choices(f.type)
        value = getattr(cfg, f.name)
        if choices and value not in choices and not (value is None and f.default is None):
            raise ConfigError(f"--{flag(f.name)} {value!r} is not valid; choose one of: {', '.join(choices)}")
    _positive(
        cfg, "epochs", "hidden", "nn_layers", "eval_every", "checkpoint_every", "heads", "decoder_layers", "link_batch"
    )
    _non_negative(
        cfg,
        "prop_steps",
        "patience",
        "chunk_rows",
        "threads",
        "num_bases",
        "nn_block_rows",
        "split",
        "seeds",
        "warmup_epochs",
        "plateau_patience",
    )
    _check_schedule(cfg)
    _check_fit_on(cfg)
    parse_split_list(cfg.splits)
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"--dropout {cfg.dropout} must be in [0, 1); e.g. --dropout 0.5")
    if cfg.input_dropout is not None and not 0.0 <= cfg.input_dropout < 1.0:
        raise ConfigError(
            f"--input-dropout {cfg.input_dropout} must be in [0, 1); e.g. --input-dropout 0 "
            "(or leave it out: --dropout)"
        )
    if not 0.0 <= cfg.alpha <= 1.0:
        raise ConfigError(f"--alpha {cfg.alpha} must be in [0, 1]; APPNP commonly uses 0.1")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr {cfg.lr} must be positive; e.g. --lr 0.01")
    if cfg.weight_decay is not None and cfg.weight_decay < 0:
        raise ConfigError(f"--weight-decay {cfg.weight_decay} must be >= 0")
    if cfg.clip_grad < 0:
        raise ConfigError(f"--clip-grad {cfg.clip_grad} must be >= 0 (0: no clipping); e.g. --clip-grad 1.0")
    if cfg.collective_timeout_s <= 0:
        raise ConfigError(f"--collective-timeout-s {cfg.collective_timeout_s} must be positive (seconds)")
    spec = cfg.model_spec
    if cfg.arch not in spec.archs:
        coupled = ", ".join(m.name for m in MODELS.values() if cfg.arch in m.archs and not m.heterogeneous)
        raise ConfigError(
            f"--model {cfg.model} is {' or '.join(spec.archs)} by nature; use --arch "
            f"{spec.archs[0]} (or a {cfg.arch} model: {coupled})"
        )
    if cfg.arch == "decoupled" and cfg.prop_steps == 0 and spec.attention:
        raise ConfigError(
            "--model gat with --arch decoupled needs --prop-steps >= 1 (attention is applied during propagation)"
        )
    parse_bytes(cfg.memory_budget, "--memory-budget")
    _check_used_options(cfg)
    if cfg.offload != "none" and cfg.mode == "data":
        raise ConfigError(
            "--offload streams tensor parallelism's chunks; the data-parallel baseline keeps its "
            "own block on the device: use --mode tp, or --offload none"
        )
    if cfg.mode == "data" and (cfg.memory_budget or cfg.chunk_rows):
        given = "--memory-budget" if cfg.memory_budget else "--chunk-rows"
        raise ConfigError(
            f"{given} cuts tensor parallelism's aggregation into chunks; the data-parallel baseline (--mode data) "
            f"aggregates each rank's rows in one block and cannot keep to it: use --mode tp (planned and chunked "
            f"to fit), or drop {given}"
        )
    if cfg.offload != "none" and cfg.model_spec.attention:
        raise ConfigError(
            "--offload streams fixed propagation operators; attention (--model gat) computes its "
            "edge values on the device every step: use --offload none (--memory-budget still "
            "chunks its aggregation)"
        )
    if cfg.resume and not cfg.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir DIR (where the checkpoints are)")
    if cfg.resume_anyway and not cfg.resume:
        raise ConfigError("--resume-anyway only applies to --resume: add --resume, or drop --resume-anyway")


def _check_used_options(cfg) -> None:  # noqa: ANN001
    """An option the chosen model, architecture or mode would ignore is an error, not a silent no-op."""
    if cfg.overlap and cfg.mode in ("single", "data"):
        raise ConfigError(
            f"--overlap overlaps the split and gather of tensor parallelism; --mode {cfg.mode} "
            "has none: use --mode tp (or drop --overlap)"
        )
    spec = cfg.model_spec
    if cfg.overlap and spec.attention:
        raise ConfigError(
            "--overlap pipelines fixed propagation operators; attention (--model gat) computes its "
            "edge weights every step and is not overlapped: drop --overlap"
        )
    if cfg.decomposition != "none" and cfg.num_bases < 1:
        raise ConfigError(f"--decomposition {cfg.decomposition} needs --num-bases N >= 1 (e.g. --num-bases 30)")
    if (cfg.decomposition != "none" or cfg.num_bases) and (not spec.heterogeneous or cfg.arch != "coupled"):
        raise ConfigError(
            "--decomposition/--num-bases shape the relation weights of coupled R-GCN layers: use "
            "--model rgcn --arch coupled, or drop them"
        )
    if cfg.sparse_embeddings and not spec.heterogeneous:
        raise ConfigError("--sparse-embeddings updates R-GCN's embedding tables: use --model rgcn, or drop it")
    if spec.heterogeneous and cfg.mode == "data":
        raise ConfigError("--model rgcn runs tensor parallel: use --mode tp (or --mode single for one process)")
    if spec.heterogeneous and cfg.input_dropout is not None:
        raise ConfigError(
            "--input-dropout applies to the homogeneous models; R-GCN's dropout is --dropout: drop --input-dropout"
        )
    if spec.heterogeneous and (cfg.overlap or cfg.offload != "none" or cfg.nn_device == "cpu"):
        raise ConfigError(
            "--overlap, --offload and --nn-device cpu apply to homogeneous models; R-GCN runs on "
            "the rank's device and its relation-wise aggregation is bounded with --memory-budget "
            "SIZE (or --chunk-rows N): drop them and use that"
        )
    _check_streaming(cfg)
    _check_classic(cfg)


def _check_classic(cfg) -> None:  # noqa: ANN001
    """The coupled layers' classic options (--residual, --jk, --input-proj, --norm): homogeneous coupled models."""
    layer_only = [name for name in cfg.classic_options if not name.startswith("--norm")]
    if cfg.arch == "decoupled" and (cfg.residual or cfg.jk != "none" or cfg.input_proj):
        raise ConfigError(
            f"{', '.join(layer_only)} shape(s) the coupled GNN layers; the decoupled NN stage is an MLP whose first "
            "Linear already projects the features (--norm applies to it): use --arch coupled, or drop them"
        )
    if cfg.model_spec.heterogeneous and (cfg.classic_options or cfg.norm != "none"):
        raise ConfigError(
            "--residual, --jk, --input-proj and --norm apply to the homogeneous models (gcn, sage, gin, gat); "
            "R-GCN's layers have none of them: drop them"
        )


def _check_streaming(cfg) -> None:  # noqa: ANN001
    """What ``--nn-device stream`` (ntp.engine.parallel.row_stream) can stream: row-wise segments only."""
    if cfg.nn_block_rows and cfg.nn_device != "stream":
        raise ConfigError(
            "--nn-block-rows sizes the blocks of --nn-device stream: add --nn-device stream, or drop --nn-block-rows"
        )
    if cfg.nn_device != "stream" or cfg.nn_streams:
        return
    if not cfg.model_spec.row_wise:
        raise ConfigError(
            f"--nn-device stream streams row-wise layers; --model {cfg.model} computes on its "
            "edges or relations on the device: use --nn-device cpu (or device) with it, or "
            "--model gcn, sage, gin, sgc or appnp"
        )
    raise ConfigError(
        "--norm batch needs statistics over all rows before any row's output, which a stage "
        "streamed in row blocks does not have: use --norm layer with --nn-device stream, or "
        "--nn-device device or cpu"
    )


def _positive(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{flag(name)} {getattr(cfg, name)} must be at least 1")


def _non_negative(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{flag(name)} {getattr(cfg, name)} must be >= 0")


def _check_fit_on(cfg) -> None:  # noqa: ANN001 (a TrainConfig)
    if cfg.holds_out_valid:
        return
    needs_valid = {
        "--patience": cfg.patience > 0,
        "--lr-schedule plateau": cfg.lr_schedule == "plateau",
        "--monitor loss": cfg.monitor == "loss",
    }
    for name, used in needs_valid.items():
        if used:
            raise ConfigError(
                f"{name} watches the valid split; --fit-on {cfg.fit_on} trains on the valid split and "
                f"leaves none: drop {name.split()[0]}, or use --fit-on train"
            )


def _check_schedule(cfg) -> None:  # noqa: ANN001 (a TrainConfig)
    if not 0.0 <= cfg.min_lr < cfg.lr:
        raise ConfigError(f"--min-lr {cfg.min_lr} must be in [0, --lr {cfg.lr}); e.g. --min-lr 0")
    if not 0.0 < cfg.plateau_factor < 1.0:
        raise ConfigError(f"--plateau-factor {cfg.plateau_factor} must be in (0, 1); e.g. --plateau-factor 0.5")
    if cfg.warmup_epochs >= cfg.epochs:
        raise ConfigError(
            f"--warmup-epochs {cfg.warmup_epochs} leaves no epoch of training at --lr (--epochs {cfg.epochs}): "
            "use fewer warm-up epochs, e.g. a tenth of --epochs"
        )
    if cfg.lr_schedule == "plateau" and cfg.eval_every != 1:
        raise ConfigError(
            "--lr-schedule plateau steps on every epoch's validation metric: use --eval-every 1, or --lr-schedule cosine"
        )


def parse_split_list(text: str, sets: int | None = None) -> list[int] | None:
    """``--splits``: "" (None: the one --split), "all" (every one of ``sets``), or a comma list of split sets."""
    text = text.strip()
    if not text:
        return None
    if text == "all":
        return list(range(sets)) if sets is not None else []
    try:
        chosen = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--splits {text!r}: write all, or split sets as a comma list, e.g. --splits 0,1,2") from None
    if any(k < 0 or (sets is not None and k >= sets) for k in chosen) or len(set(chosen)) != len(chosen):
        limit = f" 0..{sets - 1}" if sets is not None else ""
        raise ConfigError(f"--splits {text!r}: each split set once, each in{limit or ' 0..'}; e.g. --splits all")
    return chosen
