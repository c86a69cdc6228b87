"""The rendezvous stores and the process group listen on the address the job names, not on every interface.

Host A gets a second interface whose address host B can route to. torch's own TCPStore (the control) is reachable
there; a training job's stores are not, while the job trains across both hosts (and goes on training after the
probes). Every socket listening in either namespace (only the job runs there) is on that host's job address; a job
on one node listens on loopback only. That such jobs train to the end, like one process, is test_two_hosts.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multinode.hosts import Host, listening, second_address

pytestmark = pytest.mark.multinode
TRAIN = [
    "--model",
    "gcn",
    "--hidden",
    "16",
    "--seed",
    "3",
    "--device",
    "cpu",
    "--no-track",
    "--collective-timeout-s",
    "60",
]
EPOCHS = 100_000  # stopped once probed

PROBE = """
import json, socket, sys
out = []
for address, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((address, port), timeout=3).close()
        out.append("open")
    except ConnectionRefusedError:
        out.append("refused")
    except OSError as exc:
        out.append(type(exc).__name__)
print(json.dumps(out))
"""


def probe(host: Host, targets: list[tuple[str, int]]) -> list[str]:
    """From inside ``host``: whether a TCP connection to each (address, port) opens."""
    out = subprocess.run(
        host.command([sys.executable, "-c", PROBE, json.dumps(targets)]),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return json.loads(out)


def _train(host: Host, store: str, results: Path, extra: list[str]) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        store,
        "--epochs",
        str(EPOCHS),
        "--results",
        str(results),
        *TRAIN,
        *extra,
    ]
    return subprocess.Popen(host.command(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _epochs(results: Path) -> int:
    return len(results.read_text().splitlines()) if results.is_file() else 0


def _wait_for_epochs(procs: list[subprocess.Popen], results: Path, count: int) -> None:
    deadline = time.monotonic() + 240
    while _epochs(results) < count:
        assert all(p.poll() is None for p in procs), "every node trains"
        assert time.monotonic() < deadline, f"not {count} epochs within 240 s"
        time.sleep(0.3)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each node's launcher: it stops its job (ntp.run.processes)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover - the launcher ignored SIGTERM
            p.kill()
            p.communicate(timeout=30)
            raise


def test_the_control_torchs_own_store_listens_on_every_interface(hosts) -> None:
    """Why ntp binds its stores itself: a TCPStore given A's job address is reachable at A's other address too."""
    a, b = hosts
    code = (
        "import datetime, time, torch.distributed as d\n"
        f"s = d.TCPStore({a.address!r}, 29620, is_master=True, timeout=datetime.timedelta(seconds=30))\n"
        "print('up', flush=True)\ntime.sleep(60)\n"
    )
    with second_address(a, b) as other:
        server = subprocess.Popen(a.command([sys.executable, "-c", code]), stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up"
            assert probe(b, [(a.address, 29620), (other, 29620)]) == ["open", "open"]
        finally:
            server.kill()
            server.wait(timeout=30)


@pytest.mark.parametrize("give_ranks", [True, False], ids=["static", "c10d"])
def test_a_job_listens_only_on_the_address_it_names(hosts, cora_store: str, tmp_path: Path, give_ranks: bool) -> None:
    a, b = hosts
    port = 29621 + give_ranks
    results = tmp_path / "r.jsonl"
    with second_address(a, b) as other:
        procs = [
            _train(
                host,
                cora_store,
                results,
                [
                    "--nnodes",
                    "2",
                    "--nproc",
                    "2",
                    "--rdzv-endpoint",
                    f"{a.address}:{port}",
                    "--job-timeout",
                    "280",
                    *(["--node-rank", str(rank)] if give_ranks else []),
                ],
            )
            for rank, host in enumerate(hosts)
        ]
        try:
            _wait_for_epochs(procs, results, 1)
            sockets = {host: listening(host) for host in hosts}
            assert (a.address, port) in sockets[a], "node A hosts the rendezvous at the endpoint"
            for host, pairs in sockets.items():
                assert pairs and all(address == host.address for address, _ in pairs), (host, pairs)
            a_ports = sorted({p for _, p in sockets[a]})
            assert probe(b, [(other, p) for p in a_ports]) == ["refused"] * len(a_ports), "A's other address"
            assert probe(a, [("127.0.0.1", p) for p in a_ports]) == ["refused"] * len(a_ports), "A's loopback"
            assert probe(b, [(a.address, port)]) == ["open"], "the endpoint itself"
            _wait_for_epochs(procs, results, _epochs(results) + 3)  # the probes disturbed nothing
        finally:
            _stop(procs)
    last = json.loads(results.read_text().splitlines()[-1])
    assert [w["rank"] for w in last["workers"]] == [0, 1, 2, 3], "4 ranks on 2 hosts"


def test_a_job_on_one_node_listens_on_loopback_only(hosts, cora_store: str, tmp_path: Path) -> None:
    a, _b = hosts
    results = tmp_path / "r.jsonl"
    procs = [_train(a, cora_store, results, ["--nproc", "2", "--job-timeout", "280"])]
    try:
        _wait_for_epochs(procs, results, 1)
        pairs = listening(a)
        assert len(pairs) >= 3 and all(address == "127.0.0.1" for address, _ in pairs), pairs
    finally:
        _stop(procs)
