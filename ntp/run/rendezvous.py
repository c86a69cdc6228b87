"""torchrun with its rendezvous stores listening on one address, not on every interface.

torch's ``TCPStore`` server listens on every interface whatever host name it is given (torch 2.13: ``*:PORT``, IPv4
and IPv6), and what it carries is trusted: torchrun's c10d rendezvous unpickles the state it reads there, and the
workers take their peers' addresses from it. The one way torch offers to choose the address is a socket bound by the
caller (``TCPStore(master_listen_fd=...)``). This module registers two rendezvous backends in torchrun's registry
(its documented extension point) that create the stores so, then runs torchrun's own ``main``:

- ``ntp-static`` (node ranks given): torchrun's static rendezvous; node 0's store listens on the endpoint's address.
- ``ntp-c10d`` (ranks from the rendezvous): torchrun's c10d rendezvous; the hosting node's store listens on the
  endpoint's address, and the node that becomes rank 0 hosts the workers' store on its ``--local-addr`` only.

Everything else (joining, heartbeats, restarts, the workers) is torchrun's. Run as
``python -m ntp.run.rendezvous`` with torchrun's arguments, then ``--`` and what each rank runs.
"""

from __future__ import annotations

import socket
import sys
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

STATIC, C10D = "ntp-static", "ntp-c10d"
WILDCARDS = ("0.0.0.0", "::", "")


def bound_store(
    host: str, port: int, *, is_server: bool, timeout: timedelta, world_size: int | None = None
) -> TCPStore:
    """A TCPStore at ``host:port``; the server listens on ``host``'s address only (port 0: a free one)."""
    if not is_server:
        return TCPStore(host, port, world_size, False, timeout, multi_tenant=True)
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    if address[0] in WILDCARDS:
        raise ValueError(
            f"the rendezvous address {host!r} means every interface; name the address of the "
            "interface the other nodes reach this one at"
        )
    try:
        server = socket.create_server(address[:2], family=family, backlog=1024)
    except OSError as exc:
        raise RuntimeError(
            f"cannot listen on {host}:{port} ({exc.strerror}): this node must own the address "
            "(the rendezvous host is node rank 0, or the node whose address --rdzv-endpoint "
            "names) and the port must be free"
        ) from exc
    bound_port = server.getsockname()[1]
    # the store owns the socket from here (and closes it with itself)
    return TCPStore(host, bound_port, world_size, True, timeout, multi_tenant=True, master_listen_fd=server.detach())


class _BoundStatic(StaticTCPRendezvous):
    """torchrun's static rendezvous; node 0's store listens on the endpoint's address only."""

    def next_rendezvous(self):
        if self._store is None:
            self._store = bound_store(
                self.master_addr,
                self.master_port,
                is_server=self.rank == 0,
                timeout=self.timeout,
                world_size=self.world_size,
            )
        return super().next_rendezvous()

    def get_backend(self) -> str:
        return STATIC


class _Backend(C10dRendezvousBackend):
    @property
    def name(self) -> str:
        return C10D


class _BoundDynamic(DynamicRendezvousHandler):
    """torchrun's c10d rendezvous; rank 0's store for the workers listens on this node's ``--local-addr`` only."""

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> TCPStore:
        return bound_store(master_addr, master_port, is_server=True, timeout=timedelta(seconds=300))


def create_static(params: RendezvousParameters) -> StaticTCPRendezvous:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=-1)
    if "rank" not in params.config or port < 0:
        raise ValueError(f"the {STATIC} rendezvous needs --rdzv-endpoint HOST:PORT and --rdzv-conf rank=NODE_RANK")
    timeout = params.get_as_int("timeout", 600)
    return _BoundStatic(host, port, int(params.config["rank"]), params.max_nodes, params.run_id, timeout)


def create_c10d(params: RendezvousParameters) -> DynamicRendezvousHandler:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    is_host = params.get_as_bool("is_host")
    if is_host is None:
        raise ValueError(f"the {C10D} rendezvous needs --rdzv-conf is_host=0|1 (whether this node hosts its store)")
    store = bound_store(
        host, port, is_server=is_host, timeout=timedelta(seconds=params.get_as_int("read_timeout", 60) or 60)
    )
    timeouts = RendezvousTimeout(
        *(_seconds(params, f"{key}_timeout") for key in ("join", "last_call", "close", "heartbeat"))
    )
    return _BoundDynamic.from_backend(
        params.run_id,
        store,
        _Backend(store, params.run_id),
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        timeouts,
        keep_alive_interval=params.get_as_int("keep_alive_interval", 5) or 5,
        keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3) or 3,
    )


def _seconds(params: RendezvousParameters, key: str) -> timedelta | None:
    value = params.get_as_int(key)
    return None if value is None else timedelta(seconds=value)


def register() -> None:
    rendezvous_handler_registry.register(STATIC, create_static)
    rendezvous_handler_registry.register(C10D, create_c10d)


def main(argv: list[str] | None = None) -> None:
    """torchrun's main with the bound rendezvous backends registered."""
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.run import run

    register()
    record(run)(torchrun_args(sys.argv[1:] if argv is None else argv))


def torchrun_args(argv: list[str]):
    """torchrun's arguments from ``OPTIONS -- PROGRAM`` (``PROGRAM``: ``-m MODULE ARGS`` or ``SCRIPT ARGS``, what
    each rank runs), or from torchrun's own form without ``--``. torchrun's parser reads only the options and the
    program's name, because it would read the program's flags too and refuse one that abbreviates two of its own
    (argparse's prefix matching: the worker's ``--monitor`` against ``--monitor-interval`` and ``--monitor_interval``)."""
    from torch.distributed.run import parse_args

    if "--" not in argv:
        return parse_args(argv)
    cut = argv.index("--")
    options, program = argv[:cut], argv[cut + 1 :]
    name = 2 if program[:1] in (["-m"], ["--module"]) else 1
    args = parse_args(options + program[:name])
    args.training_script_args = program[name:]
    return args


if __name__ == "__main__":
    main()
