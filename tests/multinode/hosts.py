"""Two "hosts" on this machine: Linux network namespaces joined by a veth pair.

The private addresses exist only inside the namespaces this module creates, and everything is deleted at the end.
Needs root (CAP_NET_ADMIN); callers skip with the reason when :func:`two_hosts` cannot create them.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Namespaces ``ntp-a-<pid>`` (10.213.x.1) and ``ntp-b-<pid>`` (10.213.x.2) on one veth link."""
    tag = os.getpid() % 100_000
    subnet = f"10.213.{tag % 250}"
    hosts = (Host(f"ntp-a-{tag}", f"{subnet}.1"), Host(f"ntp-b-{tag}", f"{subnet}.2"))
    veth = (f"nva{tag}", f"nvb{tag}")
    created: list[str] = []
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
            created.append(host.namespace)
        _ip("link", "add", veth[0], "netns", hosts[0].namespace, "type", "veth", "peer", "name", veth[1], "netns",
            hosts[1].namespace)
        for host, dev in zip(hosts, veth):
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", dev)
            _ip("-n", host.namespace, "link", "set", dev, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for namespace in created:  # deleting a namespace deletes its end of the veth pair too
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
