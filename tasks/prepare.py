"""Build (or reuse) a graph store."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE


@task(name="prepare-store", cache_policy=NO_CACHE, task_run_name="prepare-{name}")
def prepare_store(name: str, options: dict[str, Any]) -> str:
    """``storage.prepare``: idempotent, so a store with the same options is reused, not rebuilt.

    Progress lines go to the flow run's logs. Returns the store path.
    """
    from storage import prepare

    return str(prepare(name, progress=get_run_logger().info, **options))
