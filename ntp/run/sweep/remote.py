"""A sweep whose trials run elsewhere (on a Prefect work pool: one flow run per trial). The controller asks the
study for a trial and hands its number to a runner; the runner trains it with :func:`ntp.run.sweep.trial.run_trial`,
reports its epochs and prunes itself against the study's pruner, and tells the study the result. The Optuna storage
is the rendezvous: both ends only need to reach it (and MLflow's tracking store). What the runner needs besides the
trial's number is in the study's user attribute :data:`TRIAL_JOB_ATTR`."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

from ntp.errors import ConfigError, WorkerFailed
from ntp.run.sweep.study import PARENT_ATTR, Sweep, default_storage, make_pruner, prepare_database, trial_epochs
from ntp.run.sweep.trial import ERROR_ATTR, TrialJob, run_trial
from ntp.run.tracking.mlflow_store import client, data_dir

#: The study's user attribute: what every trial's runner needs (store, experiment, fixed options, launch, pruner).
TRIAL_JOB_ATTR = "trial_job"
#: A trial's user attribute: the id of the flow run (or other job) that runs it, so a resumed controller waits for it.
RUNNER_ATTR = "runner_id"


def publish_job(sweep: Sweep) -> None:
    """Store in the study what a trial's runner needs (the latest controller's settings win)."""
    s = sweep.settings
    sweep.study.set_user_attr(
        TRIAL_JOB_ATTR,
        {
            "store": s.store,
            "experiment": sweep.experiment,
            "fixed": dict(s.space.fixed),
            "launch_args": list(s.launch_args),
            "pruner": s.pruner,
            "epochs": trial_epochs(s.space),
        },
    )


def trials_to_submit(sweep: Sweep, outstanding: int) -> int:
    """How many new trials the controller may still ask for: those left to run, less the ``outstanding`` ones it
    adopted, and for the grid sampler no more than the grid points not yet run (more would repeat one)."""
    from optuna.samplers import GridSampler
    from optuna.trial import TrialState

    left = sweep.remaining - outstanding
    if isinstance(sweep.study.sampler, GridSampler):
        points = math.prod(len(values) for values in sweep.settings.space.grid().values())
        started = [t for t in sweep.study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
        left = min(left, points - len(started))
    return max(left, 0)


def ask(sweep: Sweep) -> tuple[int, dict[str, Any]]:
    """A new trial (a re-queued interrupted one first) and its parameters, drawn here by the study's sampler."""
    with warnings.catch_warnings():  # the storage's heartbeats serve `ntp sweep`; a runner is watched by its flow run
        warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
        trial = sweep.study.ask()
    return trial.number, sweep.settings.space.suggest(trial)


def set_runner(sweep: Sweep, number: int, runner_id: str) -> None:
    """Record who runs trial ``number`` (a resumed controller waits for it instead of asking anew)."""
    from optuna.exceptions import UpdateFinishedTrialError

    storage = _storage(sweep)
    try:
        storage.set_trial_user_attr(_trial_id(storage, sweep.study.study_name, number), RUNNER_ATTR, runner_id)
    except UpdateFinishedTrialError:
        pass  # its runner has ended it already: there is nothing to wait for


def running_trials(sweep: Sweep) -> dict[int, str]:
    """Trials a previous controller handed to a runner and no one has ended yet: number -> runner id."""
    from optuna.trial import TrialState

    return {
        t.number: t.user_attrs[RUNNER_ATTR]
        for t in sweep.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if RUNNER_ATTR in t.user_attrs
    }


def trial_state(sweep: Sweep, number: int) -> Any:
    """The trial as the storage has it now (its runner may be on another machine)."""
    storage = _storage(sweep)
    return storage.get_trial(_trial_id(storage, sweep.study.study_name, number))


def fail_unfinished(sweep: Sweep, number: int, why: str) -> bool:
    """End FAIL a trial whose runner ended without telling the study (it crashed or was cancelled before it could);
    True if it was still running."""
    from optuna.trial import TrialState

    storage = _storage(sweep)
    trial_id = _trial_id(storage, sweep.study.study_name, number)
    if storage.get_trial(trial_id).state != TrialState.RUNNING:
        return False
    storage.set_trial_user_attr(trial_id, ERROR_ATTR, why)
    sweep.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    return True


def run_handed_trial(
    study_name: str, number: int, storage: str | None = None, tags: dict[str, str] | None = None
) -> Any:
    """Train trial ``number`` of ``study_name`` (asked by a controller elsewhere) as a child run of the sweep's
    parent run (with ``tags``, e.g. the runner's flow run id), pruned by the study's pruner, and tell the study its
    result. Returns the finished (frozen) trial; re-raises a failed job's WorkerFailed and an interrupt (the trial
    ends FAIL either way)."""
    import optuna
    from optuna.trial import TrialState

    url = storage or default_storage()
    rdb = _rdb(url)
    study = optuna.load_study(study_name=study_name, storage=rdb, sampler=optuna.samplers.RandomSampler())
    spec = study.user_attrs.get(TRIAL_JOB_ATTR)
    if spec is None:
        raise ConfigError(f"study {study_name!r} in {url} has no {TRIAL_JOB_ATTR!r}: start it with the sweep flow")
    trial_id = _trial_id(rdb, study_name, number)
    frozen = rdb.get_trial(trial_id)
    if frozen.state != TrialState.RUNNING:
        raise ConfigError(f"trial {number} of study {study_name!r} is {frozen.state.name}: there is nothing to run")
    study.pruner = make_pruner(spec["pruner"], spec["epochs"])
    trial = optuna.trial.Trial(study, trial_id)
    job = TrialJob(
        store=spec["store"],
        experiment=spec["experiment"],
        parent_run_id=study.user_attrs[PARENT_ATTR],
        study_name=study_name,
        folder=data_dir().resolve() / "sweeps" / study_name,
        fixed=spec["fixed"],
        launch_args=[*spec["launch_args"], *(a for k, v in (tags or {}).items() for a in ("--tag", f"{k}={v}"))],
    )
    try:
        value = run_trial(trial, dict(frozen.params), job, client())
    except optuna.TrialPruned:
        return study.tell(trial, state=TrialState.PRUNED)
    except BaseException as exc:  # a failed job (WorkerFailed), or the runner stopped (cancelled, SIGTERM)
        if not isinstance(exc, WorkerFailed):
            trial.set_user_attr(ERROR_ATTR, f"stopped: {type(exc).__name__}: {exc}"[-500:])
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        raise
    return study.tell(trial, value)


def _storage(sweep: Sweep) -> Any:
    return _rdb(sweep.settings.storage or default_storage())


def _trial_id(storage: Any, study_name: str, number: int) -> int:
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study_name), number)


@functools.cache
def _rdb(url: str) -> Any:
    """One storage handle per database in this process (its public API reaches trials by study name and number)."""
    import optuna

    prepare_database(url)
    return optuna.storages.RDBStorage(url)
