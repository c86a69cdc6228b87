"""One MLflow parent run over several runs (the splits and seeds of `ntp train --splits/--seeds`): its children
name it with ``mlflow.parentRunId``, it holds the summary. Ended FINISHED, FAILED or KILLED like every ntp run,
never left RUNNING; a launcher killed outright is closed by the next run (ntp.run.tracking.orphans)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ntp.run.tracking.mlflow_store import (
    TAG_ERROR,
    TAG_GIT,
    TAG_KIND,
    TAG_PARENT,
    client,
    experiment_id,
    git_commit,
    tracking_uri,
)
from ntp.run.tracking.orphans import close_orphaned_runs, end_status, launcher_tags
from ntp.run.tracking.runs import _param_value


@dataclass
class ParentRun:
    run_id: str
    experiment: str
    client: Any

    def child_tags(self, **tags: Any) -> dict[str, str]:
        """The tags that make a run this one's child (plus ``tags``)."""
        return {TAG_PARENT: self.run_id, **{k: str(v) for k, v in tags.items()}}

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.client.log_metric(self.run_id, key, float(value))


@contextmanager
def parent_run(
    experiment: str,
    *,
    kind: str,
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    uri: str | None = None,
    reopen: str | None = None,
) -> Iterator[ParentRun]:
    """A parent run of ``kind`` (its ``ntp.kind`` tag, e.g. "repeats") in ``experiment``, with ``params``; or, with
    ``reopen``, that run of ``experiment`` again (:func:`reopen_parent`)."""
    c = client(uri or tracking_uri())
    exp_id = experiment_id(experiment, c)
    close_orphaned_runs(c, exp_id)
    if reopen:
        run_id = reopen_parent(c, reopen)
    else:
        run_id = create_parent(c, exp_id, kind=kind, run_name=run_name, params=params, tags=tags)
    parent = ParentRun(run_id, exp_id, c)
    try:
        yield parent
    except BaseException as exc:
        try:
            c.set_tag(parent.run_id, TAG_ERROR, f"{type(exc).__name__}: {exc}"[-4900:])
        finally:
            c.set_terminated(parent.run_id, end_status(exc))
        raise
    else:
        c.set_terminated(parent.run_id, "FINISHED")


def create_parent(
    c: Any,
    exp_id: str,
    *,
    kind: str,
    run_name: str | None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> str:
    """A new RUNNING parent run of ``kind`` (its ``ntp.kind`` tag: repeats, sweep) owned by this process; its id.
    Ending it is the caller's (``parent_run`` here; a sweep ends or reopens its own)."""
    from mlflow.entities import Param

    all_tags = {TAG_KIND: kind, TAG_GIT: git_commit(), **launcher_tags(), **(tags or {})}
    run = c.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in all_tags.items() if v is not None})
    c.log_batch(run.info.run_id, params=[Param(k, _param_value(v)) for k, v in (params or {}).items()])
    return run.info.run_id


def reopen_parent(c: Any, run_id: str) -> str:
    """The ended parent run ``run_id`` RUNNING again, owned by this process (its launcher tags), to take more
    children: a sweep that resumes its study, `ntp train --continue` of a stopped --splits/--seeds run."""
    c.update_run(run_id, status="RUNNING")
    for key, value in launcher_tags().items():
        c.set_tag(run_id, key, value)
    return run_id
