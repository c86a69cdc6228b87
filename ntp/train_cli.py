"""``ntp train``: train on a store, in this process (--mode single) or as a torchrun job (--nproc M)."""
from __future__ import annotations

import argparse
import sys

from ntp.config import ConfigError, add_config_arguments, config_from_args
from ntp.launch import TrainingFailed, default_nproc, launch_training
from storage import StoreError


def add_train_command(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train a GNN on a graph store (tensor parallel with --nproc > 1)",
        description="Train a GNN on a graph store. With --nproc M > 1 this launches "
                    "`torchrun --nproc-per-node M -m ntp.train` (gloo on CPU, NCCL on GPUs, one GPU per rank); "
                    "--mode single trains in this process. Example: ntp train --store data/stores/cora-... --nproc 2 "
                    "--model gcn --epochs 200 --results results.jsonl")
    parser.add_argument("--nproc", type=int, default=None,
                        help=f"processes per node (default: all visible GPUs, else {default_nproc()}; 1 with --mode single)")
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes (default: 1; multi-node needs --rdzv-endpoint)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank in [0, nnodes) (default: 0)")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node only)")
    parser.add_argument("--job-timeout", type=float, default=None, help="kill the whole job after this many seconds")
    add_config_arguments(parser)
    parser.set_defaults(func=run_train)
    return parser


def run_train(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        nproc = args.nproc if args.nproc is not None else (1 if cfg.mode == "single" else default_nproc())
        if args.mode is None:  # default: tensor parallel when there is more than one process
            cfg = cfg.replace(mode="tp" if nproc * args.nnodes > 1 else "single")
        result = launch_training(cfg, nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                                 rdzv_endpoint=args.rdzv_endpoint, timeout_s=args.job_timeout)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"results: {result.results_path}")
    return 0
