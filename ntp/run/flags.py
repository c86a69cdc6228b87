"""Command-line flags of training: one flag per TrainConfig field, the launch flags, and their merge into a spec.

Flags, a ``--config`` YAML/TOML file and the defaults are merged here, once: flags win over the file, the file over
the defaults; ntp.spec.resolve then fixes processes, mode, backend and device.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from ntp.config import SECTIONS, TrainConfig
from ntp.model_specs import MODELS
from ntp.options import flag, literal_choices, load_config_file
from ntp.spec import DEVICES, LaunchSpec, resolve


def add_config_arguments(
    parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None, title: str = ""
) -> None:
    """One --flag per TrainConfig field but ``exclude`` (defaults None, so a --config file can fill them), in one
    argument group per section (``title`` before each group's name); with ``only``, just those fields' flags (and no
    --config). The testing aids take flags but stay out of --help."""
    if only is None:
        parser.add_argument(
            "--config",
            help="YAML or TOML file with training options (flat, or grouped by section: "
            f"{', '.join(s for s in SECTIONS if s != 'testing')}); flags given on "
            "the command line win",
        )
    chosen = [f for f in fields(TrainConfig) if f.name not in exclude and (only is None or f.name in only)]
    groups = {
        s: parser.add_argument_group(f"{title}{name}")
        for s, name in SECTIONS.items()
        if any(f.metadata["section"] == s for f in chosen)
    }
    for f in chosen:
        section = f.metadata["section"]
        own = ", ".join(f"{m.name}: {m.defaults[f.name]}" for m in MODELS.values() if f.name in m.defaults)
        default = "" if f.default in (None, "") else f"default: {f.default}"
        help_text = f.metadata["help"] + (f" ({'; '.join(x for x in (default, own) if x)})" if default or own else "")
        if section == "testing":
            help_text = argparse.SUPPRESS
        kind = f.type.removesuffix(" | None")
        group = groups[section]
        if kind == "bool":
            group.add_argument(f"--{flag(f.name)}", action="store_true", default=None, help=help_text)
        elif kind in ("int", "float"):
            group.add_argument(f"--{flag(f.name)}", type=int if kind == "int" else float, default=None, help=help_text)
        else:
            group.add_argument(
                f"--{flag(f.name)}", choices=literal_choices(f.type) or None, default=None, help=help_text
            )


def add_launch_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Processes, nodes, device and the job's time limit (ntp.spec.resolve decides what is left out)."""
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes per node (default: one per visible GPU, else 2; 1 with --mode single)",
    )
    parser.add_argument(
        "--nnodes", type=int, default=1, help="number of nodes (default: 1; several need --rdzv-endpoint)"
    )
    parser.add_argument(
        "--node-rank",
        type=int,
        default=None,
        help="this node's rank in [0, nnodes); node 0 hosts the rendezvous and tracks the run "
        "(default: assigned by the rendezvous, hosted by the node whose address it is)",
    )
    parser.add_argument(
        "--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous, the same on every node (multi-node only)"
    )
    parser.add_argument(
        "--interface",
        default=None,
        help="network interface the ranks talk over and this node's stores listen on "
        "(GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME; default: the one that routes to the rendezvous "
        "host)",
    )
    parser.add_argument(
        "--job-id",
        default=None,
        help="names the job's rendezvous and its results folder on every node (default: derived "
        "from the endpoint and the options, so the same command gives the same id)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="where ranks compute: cuda (one GPU per rank, NCCL), cpu (gloo), or auto: cuda where "
        "a GPU is visible (default: auto)",
    )
    parser.add_argument(
        "--job-timeout", type=float, default=None, help="stop the whole job after this many seconds (default: no limit)"
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge a --config file with the flags that were given."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name, None) is not None}
    base = load_config_file(args.config) if getattr(args, "config", None) else {}
    return TrainConfig.from_dict({**base, **given})


def spec_from_args(args: argparse.Namespace) -> LaunchSpec:
    """The resolved launch of parsed `ntp train` arguments."""
    return resolve(
        config_from_args(args),
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        device=args.device,
        job_timeout_s=args.job_timeout,
        interface=args.interface,
        job_id=args.job_id,
    )


def config_to_argv(cfg: TrainConfig) -> list[str]:
    """The flags that reproduce ``cfg`` (how a config reaches torchrun's workers)."""
    argv: list[str] = []
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        if value is None or value == cfg.default_of(f.name):  # the worker's TrainConfig.from_dict fills it alike
            continue
        if f.type == "bool":
            argv += [f"--{flag(f.name)}"] if value else []
        else:
            argv += [f"--{flag(f.name)}", str(value)]
    return argv
