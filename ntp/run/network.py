"""Which network a multi-node job uses: the interface that routes to the rendezvous host, and whether this node
is that host.

gloo and NCCL pick an interface by themselves (often loopback or the first one up) and torchrun's c10d rendezvous
decides who hosts its store by comparing the endpoint with the machine's hostname; both go wrong on machines with
several interfaces or namespaces. The kernel's routing table knows better: connecting a UDP socket (no packet is
sent) to the endpoint tells which local address, hence which interface, reaches it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

_SIOCGIFADDR = 0x8915
LOOPBACK = "127.0.0.1"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[IPv6]:PORT``) -> (host, port)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"rendezvous endpoint {endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def route_address(host: str, port: int) -> str:
    """The local IPv4 address the kernel would use to reach ``host``."""
    address = socket.gethostbyname(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, port))
        return s.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The name of the interface that holds IPv4 ``address`` (None if none does)."""
    return next((name for _index, name in socket.if_nameindex() if address_of(name) == address), None)


def address_of(interface: str) -> str | None:
    """The IPv4 address of ``interface`` (None if it has none or does not exist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:  # no such interface, or no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def local_address(host: str, port: int, interface: str | None = None) -> str:
    """The address this node's peers reach it at (where its stores listen): that of ``interface``, else the one
    that routes to the rendezvous host."""
    if interface:
        address = address_of(interface)
        if address is None:
            raise ValueError(
                f"--interface {interface}: no IPv4 address on it here; name an interface of this "
                f"node (`ip -brief address` lists them)"
            )
        return address
    return route_address(host, port)


def is_local_address(host: str) -> bool:
    """Whether ``host`` names an address of this machine (this node can listen on it)."""
    try:
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def job_network_env(endpoint: str | None, interface: str | None = None) -> dict[str, str]:
    """Environment for the workers of a job: gloo and NCCL use ``interface``; without one, the interface that
    routes to the rendezvous host (one node, no endpoint: loopback), unless the user's environment already names
    one. Their listening sockets are bound to that interface's address."""
    if interface:
        return dict.fromkeys(IFNAME_VARIABLES, interface)
    name = interface_of(route_address(*split_endpoint(endpoint)) if endpoint else LOOPBACK)
    return {key: name for key in IFNAME_VARIABLES if name and key not in os.environ}
