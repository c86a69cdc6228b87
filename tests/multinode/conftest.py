"""Two hosts in network namespaces, and the Cora store both read (the same path: a shared filesystem)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.multinode.hosts import Host, two_hosts
from tests.ntp.conftest import CORA_OGB


@pytest.fixture(scope="session")
def hosts() -> Iterator[tuple[Host, Host]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_NET_ADMIN)")
    try:
        with two_hosts() as pair:
            yield pair
    except OSError as exc:  # pragma: no cover - no `ip` command
        pytest.skip(f"cannot create network namespaces: {exc}")


@pytest.fixture(scope="session")
def cora_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not CORA_OGB.is_dir():
        pytest.skip(f"shared test data not found at {CORA_OGB}")
    from storage import prepare

    return str(
        prepare("cora", from_dir=CORA_OGB, out=tmp_path_factory.mktemp("stores") / "cora", progress=lambda s: None)
    )
