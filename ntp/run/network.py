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
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


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


def job_network_env(endpoint: str, interface: str | None = None) -> dict[str, str]:
    """Environment for the workers of a multi-node job: gloo and NCCL use ``interface``; without one, the interface
    that routes to the rendezvous host, unless the user's environment already names one."""
    if interface:
        return dict.fromkeys(IFNAME_VARIABLES, interface)
    host, port = split_endpoint(endpoint)
    name = interface_of(route_address(host, port))
    return {key: name for key in IFNAME_VARIABLES if name and key not in os.environ}
