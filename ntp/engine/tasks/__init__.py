"""What is learned: node classification, link prediction and heterogeneous (R-GCN) node classification, each a
package that implements :class:`ntp.engine.tasks.base.Task`; no task package imports another.
:func:`task_for` is the one place that reads which task a store (or in-memory data) is."""

from __future__ import annotations

from typing import Any

from ntp.engine.tasks.base import Task


def task_kind(source: Any) -> str:
    """ "hetero" (node types and relations), "link" (edge splits) or "node", from a store's metadata or a rank's data."""
    if getattr(source, "hetero", None):
        return "hetero"
    return "link" if source.task_type == "link" else "node"


def task_for(source: Any) -> Task:
    """The task of a store's metadata (storage.StoreMeta) or of a rank's in-memory data."""
    kind = task_kind(source)
    if kind == "hetero":
        from ntp.engine.tasks.hetero.task import HeteroTask

        return HeteroTask()
    if kind == "link":
        from ntp.engine.tasks.link.task import LinkTask

        return LinkTask()
    from ntp.engine.tasks.node.task import NodeTask

    return NodeTask()
