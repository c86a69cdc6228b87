"""One trial of a sweep: an ordinary tracked ``ntp train`` job (a child run of the sweep's parent run), whose epochs'
validation metric is reported to the Optuna trial as it trains; a trial the pruner stops is ended at once (its
process group gets SIGTERM, so its MLflow run ends KILLED and is tagged ``ntp.sweep.state=PRUNED``)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ntp.errors import ConfigError, WorkerFailed
from ntp.records import EpochRecord, Record, read_results
from ntp.run.processes import spawn_group, stop_group
from ntp.run.tracking.live import ResultsFollower

TAG_TRIAL = "ntp.sweep.trial"
TAG_STATE = "ntp.sweep.state"
TAG_SWEEP = "ntp.sweep.study"
#: The trial's user attribute holding its MLflow run id.
RUN_ID_ATTR = "mlflow_run_id"
#: Set on a trial stopped by an interrupt of the sweep: a resumed sweep runs its parameters again.
INTERRUPTED_ATTR = "interrupted"
#: A failed trial's error (the end of its output).
ERROR_ATTR = "error"


class SweepInterrupted(Exception):
    """The sweep was stopped (Ctrl-C, SIGTERM) while this trial ran; its job was stopped too."""


@dataclass
class TrialJob:
    """What every trial of a sweep shares: where and how it trains, and where it is tracked."""

    store: str
    experiment: str
    parent_run_id: str
    study_name: str
    folder: Path  #: trial folders go here (config, results, model, output log)
    fixed: dict[str, Any] = field(default_factory=dict)
    launch_args: Sequence[str] = ()  #: `ntp train` launch flags (--nproc, --device, --job-timeout)
    stop: threading.Event = field(default_factory=threading.Event)  #: set when the sweep is interrupted
    gpu_slots: queue.Queue | None = None  #: CUDA_VISIBLE_DEVICES of each concurrent trial (None: CPU trials)


def gpu_groups(parallel: int, device: str) -> list[str] | None:
    """The GPUs each of ``parallel`` concurrent trials sees (CUDA_VISIBLE_DEVICES values: the visible GPUs split
    evenly, so trials never share one); None for CPU trials."""
    from ntp.spec import visible_gpus

    if device == "cpu":
        return None
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env is not None else []
    ids = ids or [str(i) for i in range(visible_gpus())]
    if not ids or (env is not None and not visible_gpus()):
        return None
    return split_gpus(ids, parallel)


def split_gpus(ids: list[str], parallel: int) -> list[str]:
    """``ids`` in ``parallel`` equal groups (the remainder unused), as CUDA_VISIBLE_DEVICES values."""
    if len(ids) < parallel:
        raise ConfigError(
            f"--parallel {parallel} runs that many trials at once, each on its own GPU, but {len(ids)} GPU(s) are "
            "visible: lower --parallel, or use --device cpu"
        )
    per = len(ids) // parallel
    return [",".join(ids[i * per : (i + 1) * per]) for i in range(parallel)]


def slot_queue(groups: list[str] | None) -> queue.Queue | None:
    if groups is None:
        return None
    slots: queue.Queue = queue.Queue()
    for group in groups:
        slots.put(group)
    return slots


class _Reporter:
    """A ResultsFollower consumer: each evaluated epoch's validation metric to the trial; stops the job when the
    pruner says so."""

    def __init__(self, trial: Any, proc: subprocess.Popen) -> None:
        self.trial, self.proc = trial, proc
        self.pruned = False
        self.epoch: int | None = None  #: the last epoch reported

    def __call__(self, records: Sequence[Record]) -> None:
        for r in records:
            if self.pruned or not isinstance(r, EpochRecord) or r.valid_metric is None:
                continue
            self.trial.report(r.valid_metric, r.epoch)
            self.epoch = r.epoch
            if self.trial.should_prune():
                self.pruned = True
                stop_group(self.proc)


def run_trial(trial: Any, params: dict[str, Any], job: TrialJob, client: Any) -> float:
    """Train ``params`` (over ``job.fixed``) as one tracked job; returns its best validation metric. Raises
    optuna.TrialPruned when pruned, WorkerFailed when the job failed, SweepInterrupted when the sweep was stopped."""

    folder = job.folder / f"trial-{trial.number:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "results.jsonl"
    results.unlink(missing_ok=True)
    config = {**job.fixed, **params, "results": str(results), "model_out": str(folder / "model.pt")}
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [
        *train_command(job, folder / "config.yaml"),
        "--run-name",
        f"{job.study_name}-trial-{trial.number}",
        "--tag",
        f"{TAG_TRIAL}={trial.number}",
    ]
    log = folder / "output.log"
    gpus = job.gpu_slots.get() if job.gpu_slots is not None else None
    try:
        return _train(trial, job, cmd, results, log, client, gpus)
    finally:
        if gpus is not None:
            job.gpu_slots.put(gpus)


def _train(trial: Any, job: TrialJob, cmd: list[str], results: Path, log: Path, client: Any, gpus: str | None) -> float:
    import optuna

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else None
    with open(log, "w") as out:
        proc = spawn_group(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if gpus is not None:
        trial.set_user_attr("gpus", gpus)
    reporter = _Reporter(trial, proc)
    try:
        with ResultsFollower(results, [reporter], interval_s=0.5, warn=lambda line: None):
            while proc.poll() is None:
                if job.stop.wait(0.2):
                    break
    except BaseException:  # Ctrl-C in this thread (one trial at a time): the job stops, the trial is run again
        job.stop.set()
        trial.set_user_attr(INTERRUPTED_ATTR, True)
        raise
    finally:
        stop_group(proc)  # no-op when it has ended; else (interrupt) the job's whole group goes
    run_id = _trial_run_id(client, job, trial.number)
    if run_id:
        trial.set_user_attr(RUN_ID_ATTR, run_id)
    if job.stop.is_set() and not reporter.pruned:
        trial.set_user_attr(INTERRUPTED_ATTR, True)
        raise SweepInterrupted(f"trial {trial.number} stopped with the sweep")
    if reporter.pruned:
        if run_id:
            client.set_tag(run_id, TAG_STATE, "PRUNED")
        raise optuna.TrialPruned(f"pruned after epoch {(reporter.epoch or 0) + 1}")
    final = read_results(results).final if results.is_file() else None
    if proc.returncode != 0 or final is None or final.best_valid_metric is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        if run_id:
            client.set_tag(run_id, TAG_STATE, "FAIL")
        trial.set_user_attr(ERROR_ATTR, f"exit code {proc.returncode}, output in {log}")
        raise WorkerFailed(f"trial {trial.number} failed (exit code {proc.returncode}); its output ends:\n{tail}")
    if run_id:
        client.set_tag(run_id, TAG_STATE, "COMPLETE")
    trial.set_user_attr("test_metric", final.test_metric)
    trial.set_user_attr("best_epoch", final.best_epoch)
    return float(final.best_valid_metric)


def train_command(job: TrialJob, config: Path) -> list[str]:
    """The `ntp train` command of a trial: the store, its config file, and the run's place under the parent."""
    return [
        sys.executable,
        "-m",
        "ntp.run.cli",
        "train",
        "--store",
        job.store,
        "--config",
        str(config),
        "--experiment",
        job.experiment,
        "--tag",
        f"mlflow.parentRunId={job.parent_run_id}",
        "--tag",
        f"{TAG_SWEEP}={job.study_name}",
        *job.launch_args,
    ]


def _trial_run_id(client: Any, job: TrialJob, number: int) -> str | None:
    from ntp.run.tracking.mlflow_store import experiment_id

    runs = client.search_runs(
        [experiment_id(job.experiment, client)],
        f"tags.mlflow.parentRunId = '{job.parent_run_id}' and tags.`{TAG_TRIAL}` = '{number}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None
