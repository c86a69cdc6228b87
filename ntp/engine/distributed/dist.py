"""Process-group lifecycle: join with the launch spec's device (gloo on CPU, NCCL on GPUs), a timeout on every
collective, leave together."""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from ntp.engine.distributed.collectives import barrier, stage_on_host

#: Set to 1, several CUDA ranks share one GPU: gloo with host-staged collectives (tests on one-GPU machines; NCCL
#: refuses two ranks on one device). Never set by ntp itself.
SHARED_GPU_ENV = "NTP_SHARED_GPU"


@dataclass
class DistEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device
    backend: str | None  # None: a single process without a process group

    def __post_init__(self) -> None:
        # tensors report "cuda:N", so a bare "cuda" would compare unequal to where they are, and the products would
        # take their data for offloaded (bench/link_pyg.py's --device cuda did)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_distributed(timeout_s: float, device: str = "auto") -> DistEnv:
    """Join the torchrun job (gloo on CPU, NCCL on CUDA, one GPU per rank; gloo through host copies where
    :data:`SHARED_GPU_ENV` lets ranks share a GPU, for tests); a lone process gets world size 1. ``device`` is the
    launch spec's ("cpu" or "cuda"; "auto": CUDA where there is one)."""
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if not launched_by_torchrun():
        return DistEnv(0, 1, 0, 1, torch.device("cuda:0" if cuda else "cpu"), None)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cuda:
        rank_device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(rank_device)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a stuck NCCL collective aborts, not hangs
    else:
        rank_device = torch.device("cpu")
    shared = cuda and os.environ.get(SHARED_GPU_ENV) == "1"
    backend = "nccl" if cuda and not shared else "gloo"
    stage_on_host(shared)
    _import_what_the_optimiser_imports()
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=timeout_s), device_id=rank_device if backend == "nccl" else None
    )
    return DistEnv(rank, world, local_rank, local_world, rank_device, backend)


def _import_what_the_optimiser_imports() -> None:
    """The first torch optimiser imports torch._dynamo, which imports torch.distributed._shard; imported after
    init_process_group, that module keeps references to the default group, so destroy_process_group leaves gloo's
    threads running into interpreter exit, where one may free a tensor without the GIL and abort the process
    ("terminate called without an active exception"). Imported before, it holds none."""
    import torch._dynamo  # noqa: F401


def shutdown(env: DistEnv) -> None:
    """Leave the job together: a barrier first, so no rank tears down its gloo pairs while a peer still uses them
    (that aborts the process at exit: "terminate called without an active exception")."""
    if env.backend is not None and dist.is_initialized():
        barrier()
        dist.destroy_process_group()


@contextmanager
def distributed(timeout_s: float, device: str = "auto") -> Iterator[DistEnv]:
    """Join the job for the ``with`` block. After an error no teardown is attempted: peers may be inside a
    collective (tearing down could hang); the failing process exits and torchrun stops the others."""
    env = init_distributed(timeout_s, device)
    yield env
    shutdown(env)
