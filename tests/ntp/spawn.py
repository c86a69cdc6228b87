"""Run a function on W real processes joined by a gloo process group (what torchrun does, without the CLI).

The workers join with `distributed(timeout, "cpu")`: gloo even where CUDA is visible, since one GPU cannot host two
ranks (NCCL refuses them). They fork from a server process that imported torch (and ntp) once (a rank starts in tens of
milliseconds, not the seconds a fresh interpreter takes), and each takes the caller's environment as it is at the call,
as a spawned process would."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import traceback

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank: int, world: int, port: int, args: tuple, queue, env: dict) -> None:
    os.environ.clear()
    os.environ.update(env)  # the caller's, not the fork server's (a test may have set a variable since it started)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
    )
    try:
        queue.put((rank, pickle.dumps(fn(*args)), None))  # plain bytes: no shared-memory tensors
    except BaseException:  # report, never hang the parent
        queue.put((rank, None, traceback.format_exc()))


#: what the fork server imports once. ntp.engine imports Triton: where a GPU is visible the ranks import it
#: themselves, so nothing in the server can have touched the GPU before they fork.
_PRELOAD = ["torch"] if torch.cuda.is_available() else ["torch", "ntp.engine"]


def run_on_ranks(fn, world: int, *args, timeout: float = 120.0) -> list:
    """``fn(*args)`` on ``world`` processes; returns the per-rank results in rank order."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read once, when the server starts
    queue = ctx.Queue()
    port = free_port()
    env = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, queue, env)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    try:
        for _ in range(world):
            rank, value, error = queue.get(timeout=timeout)
            if error:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
