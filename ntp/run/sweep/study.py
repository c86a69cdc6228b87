"""Run a sweep: an Optuna study (TPE, random or grid; median, Hyperband or no pruning) stored beside MLflow's database
(or in it, on PostgreSQL), so the same command resumes it after a crash or a Ctrl-C, with ``parallel`` trials at
once, under one MLflow parent run that gets the leaderboard, the study's plots and the best model."""

from __future__ import annotations

import json
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ntp.errors import ConfigError, Terminated, WorkerFailed
from ntp.run.sweep.space import SearchSpace
from ntp.run.sweep.trial import (
    ERROR_ATTR,
    INTERRUPTED_ATTR,
    TAG_STATE,
    TAG_SWEEP,
    TrialJob,
    gpu_groups,
    run_trial,
    slot_queue,
)
from ntp.run.tracking.mlflow_store import TAG_ERROR, client, data_dir, experiment_id, tracking_uri
from ntp.run.tracking.nested import create_parent, reopen_parent
from ntp.run.tracking.orphans import end_status

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")
#: The study's user attributes: its parent MLflow run, and the space it was started with.
PARENT_ATTR = "mlflow_parent_run_id"
SPACE_ATTR = "search_space"
_REQUEUED_ATTR = "requeued"


@dataclass
class SweepSettings:
    space: SearchSpace
    store: str
    study_name: str
    n_trials: int = 20
    parallel: int = 1
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int | None = None
    storage: str | None = None  #: an Optuna storage URL (default: :func:`default_storage`)
    experiment: str | None = None  #: default: the store's dataset name
    register: str | None = None  #: register the best trial's model under this name
    launch_args: list[str] = field(default_factory=list)
    device: str = "auto"  #: cpu, cuda or auto: on GPUs, each concurrent trial gets its own (trial.gpu_groups)
    folder: Path | None = None  #: trial folders (default: <data dir>/sweeps/<study name>)


#: The schema of Optuna's tables in a PostgreSQL database shared with MLflow (both tools keep their schema version in
#: a table named ``alembic_version``; schemas keep the two apart).
OPTUNA_SCHEMA = "optuna"


def default_storage(uri: str | None = None) -> str:
    """The study's database: MLflow's own when that is PostgreSQL (Optuna's tables in the schema ``optuna``);
    ``optuna.db`` beside MLflow's sqlite file (a file of its own: sqlite has no schemas); else in the data directory
    (an http tracking server's database is not known here). docs/pipeline.md says why."""
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri[len('sqlite:///') :]).with_name('optuna.db')}"
    if uri.split(":", 1)[0].split("+", 1)[0] == "postgresql":
        from sqlalchemy.engine import make_url

        url = make_url(uri).update_query_dict({"options": f"-csearch_path={OPTUNA_SCHEMA}"})
        return url.render_as_string(hide_password=False)
    folder = data_dir().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def prepare_database(url: str) -> None:
    """Create the PostgreSQL schema that ``url``'s search_path names, if missing (Optuna creates its tables, not the
    schema they go in); nothing for other databases."""
    import re

    import sqlalchemy
    from sqlalchemy.engine import make_url

    u = make_url(url)
    options = u.query.get("options") or ""
    match = re.search(r"search_path=(\w+)", options if isinstance(options, str) else " ".join(options))
    if u.get_backend_name() != "postgresql" or match is None:
        return
    engine = sqlalchemy.create_engine(u)
    try:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text(f'CREATE SCHEMA IF NOT EXISTS "{match.group(1)}"'))
    finally:
        engine.dispose()


def make_sampler(name: str, space: SearchSpace, seed: int | None) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise ConfigError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def make_pruner(name: str, epochs: int) -> Any:
    """Median: stop a trial whose validation metric is below the median of earlier trials at the same epoch (after
    2 finished trials and the first 10% of the epochs); Hyperband over 1..``epochs``."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=max(1, epochs // 10))
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"unknown pruner {name!r}; choose one of {', '.join(PRUNERS)}")


def open_study(settings: SweepSettings) -> Any:
    """Create the study, or load it to resume (it must have been started with the same space)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # each trial's end is printed here
    epochs = trial_epochs(settings.space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: experimental since 2.8
        url = settings.storage or default_storage()
        prepare_database(url)
        storage = optuna.storages.RDBStorage(
            url,
            heartbeat_interval=30,  # a trial whose sweep died (SIGKILL) is failed after 2 min and run again
            grace_period=120,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
        )
    study = optuna.create_study(
        storage=storage,
        study_name=settings.study_name,
        direction="maximize",  # every ntp metric (accuracy, ROC-AUC, MRR) is better higher
        sampler=make_sampler(settings.sampler, settings.space, settings.seed),
        pruner=make_pruner(settings.pruner, epochs),
        load_if_exists=True,
    )
    space = json.dumps(settings.space.as_dict(), sort_keys=True, default=str)
    started = study.user_attrs.get(SPACE_ATTR)
    if started is None:
        study.set_user_attr(SPACE_ATTR, space)
        study.set_user_attr("store", settings.store)
    elif started != space:
        raise ConfigError(
            f"study {settings.study_name!r} was started with another search space; resume it with the same file, "
            f"or start a new study with --study-name"
        )
    return study


def trial_epochs(space: SearchSpace) -> int:
    """The epochs of a trial, the pruners' scale: the fixed value, else `ntp train`'s default."""
    return int(space.fixed.get("epochs") or _default("epochs"))


def _default(name: str) -> Any:
    from ntp.config import TrainConfig

    return TrainConfig.__dataclass_fields__[name].default


def ended_trials(study: Any) -> int:
    """Trials that have ended, however (complete, pruned, failed): the step of the parent run's best-value curve,
    which grows as trials end, in whatever order (two running at once end out of their numbers' order)."""
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def finished_trials(study: Any) -> int:
    """Trials that count towards ``n_trials``: complete, pruned, or failed on their own (not by an interrupt)."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return sum(
        t.state in done or (t.state == TrialState.FAIL and not t.user_attrs.get(INTERRUPTED_ATTR)) for t in study.trials
    )


def requeue_interrupted(study: Any) -> int:
    """Run again, first, the trials an interrupt stopped (their parameters, as new trials; the numbers of those
    already run again are kept in the study, since a finished trial cannot be changed)."""
    from optuna.trial import TrialState

    done = set(study.user_attrs.get(_REQUEUED_ATTR, []))
    fresh = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.user_attrs.get(INTERRUPTED_ATTR) and t.number not in done
    ]
    for t in fresh:
        study.enqueue_trial(t.params, skip_if_exists=True)
    if fresh:
        study.set_user_attr(_REQUEUED_ATTR, sorted(done | {t.number for t in fresh}))
    return len(fresh)


def parent_run(study: Any, settings: SweepSettings, experiment: str, c: Any) -> str:
    """The sweep's MLflow parent run: the study's own when it resumes (RUNNING again), else a new one."""
    run_id = study.user_attrs.get(PARENT_ATTR)
    if run_id:
        return reopen_parent(c, run_id)
    params = {
        "study": settings.study_name,
        "store": settings.store,
        "n_trials": settings.n_trials,
        "parallel": settings.parallel,
        "sampler": settings.sampler,
        "pruner": settings.pruner,
        "seed": settings.seed,
        "search_space": json.dumps(settings.space.as_dict(), default=str),
    }
    run_id = create_parent(
        c,
        experiment_id(experiment, c),
        kind="sweep",
        run_name=f"sweep-{settings.study_name}",
        params=params,
        tags={TAG_SWEEP: settings.study_name, "mlflow.source.name": "ntp sweep"},
    )
    study.set_user_attr(PARENT_ATTR, run_id)
    return run_id


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set ``stop`` (every running trial stops its job) and then raise in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        stop.set()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(f"stopped by signal {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass
class Sweep:
    """A started sweep: its study, parent run, the trials' shared job, and how many trials are left."""

    settings: SweepSettings
    study: Any
    parent_run_id: str
    experiment: str
    job: TrialJob
    client: Any
    remaining: int
    on_line: Callable[[str], None] = print

    def objective(self, trial: Any) -> float:
        return run_trial(trial, self.settings.space.suggest(trial), self.job, self.client)

    def report(self, study: Any, trial: Any) -> None:
        """After each trial: a line, and the best value so far as the parent run's curve (step: the trials ended, so
        its last point is the best of all: by trial number, a trial that ended before a lower-numbered best one
        would have the last word)."""
        value = "" if trial.value is None else f" valid {trial.value:.4f}"
        error = trial.user_attrs.get(ERROR_ATTR)
        self.on_line(
            f"[sweep] trial {trial.number} {trial.state.name}{value} {trial.params}" + (f": {error}" if error else "")
        )
        if any(t.value is not None for t in study.get_trials(deepcopy=False)):
            self.client.log_metric(self.parent_run_id, "best_valid_metric", study.best_value, step=ended_trials(study))

    def fail(self, exc: BaseException) -> None:
        """End the parent run KILLED (interrupt) or FAILED (error), and stop the running trials."""
        self.job.stop.set()
        self.client.set_tag(self.parent_run_id, "ntp.error", f"{type(exc).__name__}: {exc}"[-4900:])
        self.client.set_terminated(self.parent_run_id, end_status(exc))

    def close_trial_runs(self) -> list[str]:
        """End KILLED the trials' MLflow runs still RUNNING once every trial has ended (a job killed before it
        could end its run: SIGKILL after its grace, or a runner killed outright); returns their ids. A run its
        trial tagged already keeps its state: a pruned trial's job is stopped on purpose, and on a loaded machine
        its grace may pass first."""
        c = self.client
        runs = c.search_runs(
            [experiment_id(self.experiment, c)],
            f"tags.mlflow.parentRunId = '{self.parent_run_id}' and attributes.status = 'RUNNING'",
        )
        for run in runs:
            if TAG_STATE not in run.data.tags:
                c.set_tag(run.info.run_id, TAG_ERROR, "its trial ended without ending this run (its job was killed)")
                c.set_tag(run.info.run_id, TAG_STATE, "FAIL")
            c.set_terminated(run.info.run_id, "KILLED")
        if runs:
            self.on_line(
                f"[sweep] ended KILLED the MLflow run(s) {[r.info.run_id for r in runs]} their trials left RUNNING"
            )
        return [run.info.run_id for run in runs]


def start_sweep(settings: SweepSettings, on_line: Callable[[str], None] = print) -> Sweep:
    """Open (or resume) the study and its parent run; interrupted trials are queued to run again first."""
    from storage import open_store

    if settings.n_trials < 1 or settings.parallel < 1:
        raise ConfigError("--trials and --parallel must be at least 1")
    experiment = settings.experiment or open_store(settings.store).meta.name
    c = client()
    study = open_study(settings)
    run_id = parent_run(study, settings, experiment, c)
    job = TrialJob(
        store=settings.store,
        experiment=experiment,
        parent_run_id=run_id,
        study_name=settings.study_name,
        folder=settings.folder or data_dir().resolve() / "sweeps" / settings.study_name,
        fixed=dict(settings.space.fixed),
        launch_args=settings.launch_args,
        gpu_slots=slot_queue(gpu_groups(settings.parallel, settings.device)),
    )
    requeued = 0 if settings.sampler == "grid" else requeue_interrupted(study)  # grid revisits them itself
    remaining = max(settings.n_trials - finished_trials(study), 0)
    on_line(
        f"[sweep] study {settings.study_name}: {remaining} of {settings.n_trials} trials to run"
        + (f" ({requeued} interrupted trial(s) again first)" if requeued else "")
        + f", {settings.parallel} at a time; parent run {run_id}"
    )
    return Sweep(settings, study, run_id, experiment, job, c, remaining, on_line)


def optimize(settings: SweepSettings, on_line: Callable[[str], None] = print) -> Sweep:
    """Run the trials still to run here, ``parallel`` at once (Optuna's threads, each watching one training job).
    The parent run ends KILLED on an interrupt, FAILED on an error, and stays RUNNING on success (the report ends
    it)."""
    sweep = start_sweep(settings, on_line)
    try:
        with _stop_on_signals(sweep.job.stop):
            if sweep.remaining:
                sweep.study.optimize(
                    sweep.objective,
                    n_trials=sweep.remaining,
                    n_jobs=settings.parallel,
                    catch=(WorkerFailed,),
                    callbacks=[sweep.report],
                )
    except BaseException as exc:
        sweep.fail(exc)
        raise
    finally:  # every trial has ended here (Optuna waits for its threads, each for its job's process group)
        sweep.close_trial_runs()
    return sweep
