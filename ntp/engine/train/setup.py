"""A rank's job, built from a config and the process group: the run-wide settings (threads, precision, output
paths), then the task of the data (ntp.engine.tasks.task_for) loads and builds the rest."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.device import host_heap, precision
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.tasks import task_for
from ntp.engine.tasks.base import Job
from ntp.engine.train.checkpoint import check_output_paths
from ntp.errors import ConfigError
from ntp.spec import mode_for

#: (config, world size, rank) -> this rank's data (in memory: tests and benchmarks)
DataLoader = Callable[[TrainConfig, int, int], Any]


def setup(cfg: TrainConfig, env: DistEnv, load: DataLoader | None = None) -> Job:
    cfg = cfg.replace(mode=mode_for(cfg.mode, env.world))
    if env.world > 1 and cfg.mode == "single":
        raise ConfigError("--mode single runs one process; use --mode tp with several processes (or --nproc 1)")
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // env.local_world))
    precision.configure(cfg.precision, env.device)
    if cfg.memory_budget_bytes and env.device.type == "cpu":
        host_heap.keep_large_blocks_mapped()  # the budget bounds the resident set, not only the live tensors
    if cfg.overlap and env.device.type == "cpu" and env.world > 1 and env.is_main:
        _warn_cpu_overlap(env.local_world * torch.get_num_threads())
    if env.is_main:  # only rank 0 writes: other nodes may not see its paths
        check_output_paths(cfg)
    if load is not None:
        data = load(cfg, env.world, env.rank)
        task = task_for(data)
    else:
        store = open_training_store(cfg)
        task = task_for(store.meta)
        data = task.load(cfg, env, store)
    return task.build(cfg.for_task(data.task_type), env, fitted_splits(data, cfg))


def fitted_splits(data: Any, cfg: TrainConfig) -> Any:
    """``data`` with the splits the loss sees: under --fit-on train+valid the valid vertices join train, and no
    valid split is left to evaluate (so none to select on)."""
    if cfg.holds_out_valid:
        return data
    splits = data.splits
    train = np.union1d(splits["train"], splits["valid"]).astype(np.int64)
    return dataclasses.replace(data, splits={**splits, "train": train, "valid": np.asarray(splits["valid"])[:0]})


def open_training_store(cfg: TrainConfig) -> Any:
    """The store of ``--store`` (storage.Store); ConfigError when none is given."""
    if not cfg.store:
        raise ConfigError("no graph store given; pass --store PATH (build one with `ntp data prepare NAME`)")
    from storage import open_store

    return open_store(cfg.store)


def _warn_cpu_overlap(busy_threads: int) -> None:
    cores = os.cpu_count() or 1
    if busy_threads >= cores:
        print(
            f"[ntp] warning: --overlap on CPU ranks that use all {cores} cores ({busy_threads} compute threads): "
            "gloo's communication is CPU work too, so it has nothing idle to overlap with and overlapping may be a "
            "few percent slower here (docs/benchmarks.md, section 6); it pays where a GPU or a network link "
            "moves the data",
            flush=True,
        )
