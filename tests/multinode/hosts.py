"""Two "hosts" on this machine: Linux network namespaces joined by a veth pair.

The private addresses exist only inside the namespaces this module creates, and everything is deleted at the end
(the namespaces of a test process that was killed before it could are deleted by the next one: their names carry the
creating process's pid).
Needs root (CAP_NET_ADMIN); callers skip with the reason when :func:`two_hosts` cannot create them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


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
    _delete_orphans()
    tag = os.getpid()
    subnet = f"10.213.{tag % 250}"
    hosts = (Host(f"ntp-a-{tag}", f"{subnet}.1"), Host(f"ntp-b-{tag}", f"{subnet}.2"))
    veth = (f"nva{tag}", f"nvb{tag}")
    created: list[str] = []
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
            created.append(host.namespace)
        _ip(
            "link",
            "add",
            veth[0],
            "netns",
            hosts[0].namespace,
            "type",
            "veth",
            "peer",
            "name",
            veth[1],
            "netns",
            hosts[1].namespace,
        )
        for host, dev in zip(hosts, veth):
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", dev)
            _ip("-n", host.namespace, "link", "set", dev, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for namespace in created:  # deleting a namespace deletes its end of the veth pair too
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


def _delete_orphans() -> None:
    """Delete the namespaces of test processes that are gone."""
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        match = re.fullmatch(r"ntp-[ab]-(\d+)", line.split()[0]) if line.strip() else None
        if match and not Path(f"/proc/{match.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", match.group(0)], capture_output=True, timeout=30)


@contextmanager
def second_address(host: Host, peer: Host) -> Iterator[str]:
    """Another interface on ``host`` (an empty bridge with its own address) that ``peer`` routes to through ``host``:
    an address of ``host`` that ``peer`` reaches, but not the one a job names. Removed at the end."""
    tag = os.getpid()
    subnet, dev = f"10.214.{tag % 250}", f"ndx{tag}"
    _ip("-n", host.namespace, "link", "add", dev, "type", "bridge")
    try:
        _ip("-n", host.namespace, "addr", "add", f"{subnet}.1/24", "dev", dev)
        _ip("-n", host.namespace, "link", "set", dev, "up")
        _ip("-n", peer.namespace, "route", "add", f"{subnet}.0/24", "via", host.address)
        yield f"{subnet}.1"
    finally:
        subprocess.run(["ip", "-n", peer.namespace, "route", "del", f"{subnet}.0/24"], capture_output=True, timeout=30)
        subprocess.run(["ip", "-n", host.namespace, "link", "del", dev], capture_output=True, timeout=30)


def listening(host: Host) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket listening in ``host``'s namespace."""
    out = subprocess.run(host.command(["ss", "-ltnH"]), check=True, capture_output=True, text=True, timeout=30).stdout
    pairs = []
    for line in out.splitlines():
        address, _, port = line.split()[3].rpartition(":")
        pairs.append((address.strip("[]"), int(port)))
    return pairs
