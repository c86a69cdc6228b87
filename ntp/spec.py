"""The launch spec: how many processes run a training config, where, and in which mode, decided once.

Flags, a ``--config`` file and defaults are merged into a :class:`TrainConfig` (ntp.run.flags); :func:`resolve`
then fixes everything that depends on the machine and the process count, and every layer (launcher, tracking,
workers) reads the frozen result. This is the only place where defaults for processes, mode, backend and device
are chosen.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Literal

from ntp.config import TrainConfig
from ntp.errors import ConfigError

Device = Literal["auto", "cpu", "cuda"]
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """A resolved launch: ``config.mode`` is never empty here, ``device`` is never "auto"."""

    config: TrainConfig
    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int | None = None  #: None: the rendezvous assigns it
    rdzv_endpoint: str | None = None
    interface: str | None = None  #: network interface of gloo/NCCL (None: the one that routes to the rendezvous)
    job_id: str | None = None  #: the same on every node of a job (names its rendezvous and its files)
    device: Literal["cpu", "cuda"] = "cpu"
    job_timeout_s: float | None = None  #: the whole job is stopped after this many seconds (None: no limit)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def mode(self) -> str:
        return self.config.mode  # type: ignore[return-value]

    @property
    def backend(self) -> str | None:
        """The process-group backend: NCCL between GPUs, gloo between CPU processes, none for one process."""
        if self.mode == "single":
            return None
        return "nccl" if self.device == "cuda" else "gloo"

    def describe(self) -> str:
        where = f"{self.nnodes} node(s) x {self.nproc_per_node} process(es)"
        return f"{self.mode} on {where}, device {self.device}, backend {self.backend or 'none'}"


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc(device: str, gpus: int) -> int:
    """One process per GPU; on CPU two (gloo ranks share the cores), or one on a one-core machine."""
    return gpus if device == "cuda" else min(2, os.cpu_count() or 1)


def resolve(
    config: TrainConfig,
    *,
    nproc: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    device: str = "auto",
    job_timeout_s: float | None = None,
    interface: str | None = None,
    job_id: str | None = None,
    gpus: int | None = None,
) -> LaunchSpec:
    """The launch of ``config``: processes per node default to the GPUs (else 2 on CPU; 1 for ``--mode single``),
    the mode to ``single`` for one process and ``tp`` for several. Contradictions raise :class:`ConfigError`."""
    gpus = visible_gpus() if gpus is None else gpus
    device = _resolve_device(device, gpus)
    if nproc is None:
        nproc = 1 if config.mode == "single" else default_nproc(device, gpus)
    _check_counts(nproc, nnodes, node_rank, rdzv_endpoint, job_timeout_s)
    world = nproc * nnodes
    mode = mode_for(config.mode, world)
    if mode == "single" and world > 1:
        raise ConfigError(
            f"--mode single runs one process, but --nproc {nproc} x --nnodes {nnodes} asks for {world}: "
            "use --mode tp (or data), or drop --nproc"
        )
    if device == "cuda" and nproc > gpus:
        raise ConfigError(
            f"{nproc} processes per node on {gpus} GPU(s): NCCL cannot run two ranks on one GPU "
            f"('Duplicate GPU detected'); use --nproc {gpus} or fewer, or --device cpu"
        )
    config = config.replace(mode=mode)
    if nnodes > 1 and not job_id:
        job_id = derived_job_id(config, rdzv_endpoint or "")
    return LaunchSpec(
        config=config,
        nnodes=nnodes,
        nproc_per_node=nproc,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        device=device,
        job_timeout_s=job_timeout_s,
        interface=interface,
        job_id=job_id,
    )


def derived_job_id(config: TrainConfig, rdzv_endpoint: str) -> str:
    """What every node of a job computes alike from the same command: the rendezvous and the configuration."""
    digest = hashlib.sha256(f"{rdzv_endpoint}|{config.to_json()}".encode()).hexdigest()[:12]
    return f"{config.model}-{digest}"


def resolve_in_worker(config: TrainConfig, device: str = "auto") -> LaunchSpec:
    """The spec of a process that torchrun started (its environment says how many there are), or of a lone one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return resolve(
        config,
        nproc=local,
        nnodes=max(1, world // max(local, 1)),
        node_rank=None,
        device=device,
        rdzv_endpoint=_torchrun_endpoint(),
    )


def _torchrun_endpoint() -> str | None:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else None


def _resolve_device(device: str, gpus: int) -> Literal["cpu", "cuda"]:
    if device not in DEVICES:
        raise ConfigError(f"--device {device!r} is not valid; choose one of: {', '.join(DEVICES)}")
    if device == "cuda" and gpus == 0:
        raise ConfigError("--device cuda, but no CUDA GPU is visible here; use --device cpu (or auto)")
    if device == "auto":
        return "cuda" if gpus else "cpu"
    return device  # type: ignore[return-value]


def _check_counts(
    nproc: int, nnodes: int, node_rank: int | None, rdzv_endpoint: str | None, job_timeout_s: float | None
) -> None:
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc} must be at least 1 (processes per node)")
    if nnodes < 1:
        raise ConfigError(f"--nnodes {nnodes} must be at least 1")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} must be in [0, --nnodes {nnodes})")
    if nnodes > 1 and not rdzv_endpoint:
        raise ConfigError("multi-node training needs --rdzv-endpoint HOST:PORT (the same on every node)")
    if rdzv_endpoint and not rdzv_endpoint.rpartition(":")[2].isdigit():
        raise ConfigError(f"--rdzv-endpoint {rdzv_endpoint!r} is not HOST:PORT, e.g. --rdzv-endpoint 10.0.0.1:29500")
    if rdzv_endpoint and rdzv_endpoint.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::", "*", ""):
        raise ConfigError(
            f"--rdzv-endpoint {rdzv_endpoint!r} names every interface: the rendezvous store would "
            "accept anyone who reaches the port; give the address of the interface the other nodes reach "
            "the rendezvous host at, e.g. --rdzv-endpoint 10.0.0.1:29500"
        )
    if job_timeout_s is not None and job_timeout_s <= 0:
        raise ConfigError(f"--job-timeout {job_timeout_s} must be positive (seconds), or left out for no limit")


def mode_for(requested: str | None, world_size: int) -> str:
    """The execution mode: the one asked for, else ``single`` for one process and ``tp`` for several."""
    return requested or ("single" if world_size == 1 else "tp")
