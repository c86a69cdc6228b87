"""A tracked training job: launch it inside a parent MLflow run that shows its curves while it trains."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ntp.engine.tasks import task_for
from ntp.engine.train.schedule import describe as describe_schedule
from ntp.records import FinalRecord, read_results
from ntp.run.launch import launch_training, leads
from ntp.run.tracking.live import Consumer, EpochLogger, ResultsFollower
from ntp.run.tracking.mlflow_store import check_server, data_dir
from ntp.run.tracking.orphans import end_status
from ntp.run.tracking.runs import start_training_run
from ntp.run.tracking.tables import summarize
from ntp.spec import LaunchSpec


@dataclass
class TrackedTraining:
    """What a training job produced (``run_id`` is None when it was not tracked)."""

    run_id: str | None
    results_path: Path | None
    model_path: Path | None
    wall_s: float
    summary: dict[str, float]
    world_size: int
    config: dict[str, Any] = field(default_factory=dict)
    final: FinalRecord | None = None
    tracking_lost: bool = False  #: the tracking server stopped answering during the job (the run is incomplete)
    registered_version: str | None = None  #: the model registry version made with ``register``


def default_run_name(spec: LaunchSpec) -> str:
    """``model-arch-mode-<world size>-<date>``, e.g. ``gcn-decoupled-tp-4-20261123-0215``."""
    cfg = spec.config
    return f"{cfg.model}-{cfg.arch}-{spec.mode}-{spec.world_size}-{datetime.datetime.now():%Y%m%d-%H%M}"


def train_untracked(
    spec: LaunchSpec, *, on_line: Callable[[str], None] = print, consumers: Sequence[Consumer] = ()
) -> TrackedTraining:
    """Launch without MLflow (``--no-track``, or a node that does not lead a multi-node job)."""
    results = spec.config.results
    if results and consumers:
        with ResultsFollower(results, consumers, warn=on_line):
            res = launch_training(spec, on_line=on_line)
    else:
        res = launch_training(spec, on_line=on_line)
    final = read_results(res.results_path).final if res.results_path else None
    return TrackedTraining(
        None, res.results_path, res.model_path, res.wall_s, {}, spec.world_size, spec.config.to_dict(), final
    )


def train_tracked(
    spec: LaunchSpec,
    *,
    experiment: str | None = None,
    run_name: str | None = None,
    flow_run_id: str | None = None,
    on_line: Callable[[str], None] = print,
    consumers: Sequence[Consumer] = (),
    system_metrics: bool = True,
    register: str | None = None,
    tags: dict[str, str] | None = None,
) -> TrackedTraining:
    """Launch ``spec`` inside a parent MLflow run: epochs are logged as they happen, the summary, worker runs,
    plots and model when the job ends. Results and model go to ``<data dir>/runs/<run id or job id>/`` unless the
    config names them. A failed job's run ends FAILED with what it logged so far, and the error is re-raised. Of a
    multi-node job only the leading node tracks (ntp.run.launch.leads); the others just train. The best model of
    a node task is also logged as an MLflow model, and with ``register`` registered as a new version of that name.
    A tracking server that does not answer stops the job before it starts (TrackingUnavailable); one lost while it
    trains is said once, and the job trains on and ends with its results file (ntp.run.tracking.guard).
    ``tags``: extra run tags (``mlflow.parentRunId`` makes the run a child, as a sweep's trials are)."""
    if not leads(spec):  # it names the files the leader will, or the ranks' configs would disagree
        return train_untracked(with_outputs_in(spec, job_dir(spec.job_id or "")), on_line=on_line, consumers=consumers)
    from storage import open_store

    check_server()
    cfg = spec.config
    store_meta = open_store(cfg.store).meta
    meta = store_meta.to_dict()
    params = cfg.for_task(meta["task_type"]).to_dict()  # the values the ranks train with
    params["lr_schedule_resolved"] = describe_schedule(cfg)
    with start_training_run(
        params,
        world_size=spec.world_size,
        store_meta=meta,
        store_path=cfg.store,
        experiment=experiment,
        run_name=run_name or default_run_name(spec),
        flow_run_id=flow_run_id,
        system_metrics=system_metrics,
        tags={"ntp.nnodes": spec.nnodes, "ntp.nproc": spec.nproc_per_node, "ntp.device": spec.device, **(tags or {})},
        warn=on_line,
        lost_note="; its results file is written to the end, as without tracking",
    ) as run:
        spec = with_outputs_in(spec, job_dir(spec.job_id or run.run_id))
        cfg = spec.config
        run.set_tags({"ntp.results": cfg.results, "ntp.model_out": cfg.model_out})  # params hold the requested values
        res = _launch_followed(run, spec, consumers, on_line)
        summary = _log_outcome(run, cfg, res, meta)
    final = read_results(cfg.results).final
    logged = None
    if res.model_path is not None and "predictions" in task_for(store_meta).exports and not run.lost:
        logged = _log_mlflow_model(run.run_id, res.model_path, cfg, meta, final, register, on_line)  # a pyfunc
    return TrackedTraining(
        run.run_id,
        Path(cfg.results),
        res.model_path,
        res.wall_s,
        summary,
        spec.world_size,
        cfg.to_dict(),
        final,
        tracking_lost=run.lost,
        registered_version=None if logged is None or logged["version"] is None else str(logged["version"]),
    )


def _launch_followed(run: Any, spec: LaunchSpec, consumers: Sequence[Consumer], on_line: Callable[[str], None]):
    """``launch_training(spec)`` with each epoch logged to ``run`` (and handed to ``consumers``) as it is written;
    when the job fails, the results it wrote so far are logged before the error is raised on."""
    results = spec.config.results
    try:
        with ResultsFollower(results, [EpochLogger(run), *consumers], warn=on_line):
            return launch_training(spec, on_line=on_line)
    except BaseException as exc:
        if Path(results).is_file():
            try:
                run.log_results(results, status=end_status(exc))
            except Exception as log_exc:  # never hide the training error behind a logging error
                if not run.lost:  # a lost server was said once
                    on_line(f"warning: could not log partial results: {log_exc}")
        raise


def _log_outcome(run: Any, cfg: Any, res: Any, meta: dict) -> dict[str, float]:
    """The finished job's summary, workers, files and model, into ``run``; where its server is lost (before or
    during this), the summary alone, from the results file."""
    try:
        summary = run.log_results(cfg.results)
        if res.model_path is not None:
            run.log_model(res.model_path, config=cfg.to_dict(), store_meta=meta)
        run.log_metrics({"wall_s": res.wall_s})
        return summary
    except Exception:
        if not run.lost:  # a skipped call's None broke the rest: already said
            raise
    return summarize(read_results(cfg.results), run.num_edges)


def _log_mlflow_model(
    run_id: str,
    model_path: Path,
    cfg: Any,
    meta: dict,
    final: FinalRecord | None,
    register: str | None,
    on_line: Callable[[str], None],
) -> dict[str, Any] | None:
    """The best model as an MLflow model (after the run ended: MLflow reopens it). Failing to log it is a warning
    (the training succeeded), unless ``register`` asked for it."""
    from ntp.run.tracking.mlflow_model import log_mlflow_model

    metrics = {"best_valid_metric": final.best_valid_metric, "test_metric": final.test_metric} if final else {}
    try:
        logged = log_mlflow_model(
            run_id,
            model_path,
            store=cfg.store,
            store_meta=meta,
            config=cfg.to_dict(),
            metrics=metrics,
            register=register,
        )
    except Exception as exc:
        if register:
            raise
        on_line(f"warning: the model could not be logged as an MLflow model: {type(exc).__name__}: {exc}")
        return None
    if register:
        on_line(f"[ntp] registered {register} version {logged['version']} ({logged['model_uri']})")
    return logged


def job_dir(name: str) -> Path:
    """``<data dir>/runs/<name>``: on a filesystem every node shares, for a multi-node job."""
    return data_dir().resolve() / "runs" / name


def with_outputs_in(spec: LaunchSpec, folder: Path) -> LaunchSpec:
    """The results file and the model in ``folder`` unless the config names them."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = spec.config.replace(
        results=spec.config.results or str(folder / "results.jsonl"),
        model_out=spec.config.model_out or str(folder / "model.pt"),
    )
    return dataclasses.replace(spec, config=cfg)
