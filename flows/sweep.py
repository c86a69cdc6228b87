"""The `sweep` flow: the controller of an Optuna study whose trials are flow runs of the `sweep-trial` deployment
on the GPU pool (one flow run per trial; the pool's concurrency limit bounds how many train at once). It asks the
study for trials, keeps at most ``parallel`` trial flow runs outstanding, waits for their final states (with
timeouts), then logs the leaderboard and plots to the MLflow parent run, publishes a Prefect artifact and registers
the best model (challenger; champion if it wins, which triggers the predict deployment). Re-running it with the
same study name resumes it (and waits for the trial flow runs the previous run left going).

The controller must not hold a slot of the pool its trials need (with a limit of 1 it would wait for them forever):
its deployment is on a pool of its own, `control-pool` (prefect.yaml)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Cancelling

from flows.params import LaunchOptions
from ntp.errors import ConfigError
from ntp.run.sweep import remote
from ntp.run.sweep.space import load_space, parse_space
from ntp.run.sweep.study import Sweep, SweepSettings, start_sweep
from ntp.run.sweep.sweep import finish_sweep
from tasks.promote import announce_champion
from tasks.publish import artifact_key
from tasks.sweep import publish_sweep

TRIAL_DEPLOYMENT = "sweep-trial/sweep-trial"
#: How long a cancelled trial flow run may take to stop before the controller stops waiting for it.
CANCEL_GRACE_S = 120.0


def _launch_args(launch: LaunchOptions) -> list[str]:
    argv = ["--device", launch.device]
    if launch.nproc:
        argv += ["--nproc", str(launch.nproc)]
    if launch.job_timeout_s:
        argv += ["--job-timeout", str(launch.job_timeout_s)]
    return argv


@flow(name="sweep")
def sweep(
    store: str,
    space: dict[str, Any] | str,
    study_name: str,
    trials: int = 20,
    parallel: int = 1,
    sampler: Literal["tpe", "random", "grid"] = "tpe",
    pruner: Literal["median", "hyperband", "none"] = "median",
    seed: int | None = None,
    experiment: str | None = None,
    registered_model: str | None = None,
    champion_margin: float = 0.0,
    launch: LaunchOptions = LaunchOptions(nproc=1),
    storage: str | None = None,
    trial_deployment: str = TRIAL_DEPLOYMENT,
    trial_timeout_s: float | None = None,
    queue_timeout_s: float = 24 * 3600.0,
    poll_s: float = 2.0,
) -> dict[str, Any]:
    """Search ``space`` (a YAML file's path, or its content: ``{"space": {...}, "fixed": {...}}``) on ``store``
    with ``trials`` trials, each a flow run of ``trial_deployment``, at most ``parallel`` submitted at once (the
    pool's limit decides how many of them train at once). ``storage``: the Optuna database every trial's machine
    reaches (default: beside MLflow's, or in it on PostgreSQL, as `ntp sweep`; each machine derives it from its own
    MLFLOW_TRACKING_URI, which must be the same everywhere). A trial flow run that runs longer than ``trial_timeout_s``
    (default: the launch's job timeout plus 10 minutes, else 24 h) or waits for a pool slot longer than
    ``queue_timeout_s`` is cancelled and its trial ends FAIL. The study named ``study_name`` resumes."""
    logger = get_run_logger()
    settings = SweepSettings(
        space=load_space(space) if isinstance(space, str) else parse_space(space, source="the space parameter"),
        store=store,
        study_name=study_name,
        n_trials=trials,
        parallel=parallel,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        storage=storage,  # None: each end resolves it from MLflow's URI (no password in the trials' parameters)
        experiment=experiment,
        register=registered_model,
        launch_args=_launch_args(launch),
        device="cpu",  # no GPUs are shared out here: each trial flow run trains on its own pool machine's
    )
    started = start_sweep(settings, on_line=logger.info)
    if trial_timeout_s is None:
        trial_timeout_s = launch.job_timeout_s + 600.0 if launch.job_timeout_s else 24 * 3600.0
    try:
        remote.publish_job(started)
        run_trial_flows(started, trial_deployment, trial_timeout_s, queue_timeout_s, poll_s)
        started.close_trial_runs()  # says which, through the sweep's logger
    except BaseException as exc:
        started.fail(exc)
        raise
    result = finish_sweep(started, margin=champion_margin)
    publish_sweep(result, artifact_key(f"sweep-{study_name}"))
    decision = (result.registered or {}).get("decision")
    if decision and decision["promoted"]:
        announce_champion(decision, store)
    return {
        "parent_run_id": result.parent_run_id,
        "best_trial": result.best_trial,
        "best_value": result.best_value,
        "best_params": result.best_params,
        "counts": result.counts,
        "registered": result.registered,
    }


def run_trial_flows(
    sweep: Sweep, deployment: str, trial_timeout_s: float, queue_timeout_s: float, poll_s: float
) -> None:
    """Submit the trials still to run as flow runs of ``deployment``, ``parallel`` outstanding at most, and wait for
    each to end; a trial whose flow run ended without telling the study (crashed, cancelled) ends FAIL. On an error
    or an interrupt here, the outstanding trial flow runs are cancelled (their trials run again on resume)."""
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_deployment_by_name(deployment).work_pool_name
        except ObjectNotFound:
            raise ConfigError(f"no deployment {deployment!r}: run `prefect deploy --all` in the project") from None
        outstanding = _adopt(sweep, client)
        to_submit = remote.trials_to_submit(sweep, len(outstanding))
        logger.info(
            "%d trial flow run(s) to submit to %s on pool %s, %d outstanding at most%s",
            to_submit,
            deployment,
            pool,
            sweep.settings.parallel,
            f"; waiting for {len(outstanding)} left going by the previous run" if outstanding else "",
        )
        watch = _Watch(sweep, client, trial_timeout_s, queue_timeout_s, pool)
        try:
            while outstanding or to_submit:
                while to_submit and len(outstanding) < sweep.settings.parallel:
                    number, run = _submit(sweep, deployment)
                    outstanding[number] = run
                    to_submit -= 1
                time.sleep(poll_s)
                for number, run in list(outstanding.items()):
                    if watch.done(number, run):
                        del outstanding[number]
        except BaseException:
            _cancel(client, list(outstanding.values()), "the sweep flow stopped")
            raise


@dataclass
class _Watch:
    """What the controller does with an outstanding trial flow run at each poll."""

    sweep: Sweep
    client: Any
    trial_timeout_s: float
    queue_timeout_s: float
    pool: str
    cancelled: dict[int, tuple[float, str]] = field(default_factory=dict)  #: trial -> (when, why)

    def done(self, number: int, run: FlowRun) -> bool:
        """True once the controller is done with it: it ended, or it did not stop in time after a cancel."""
        run = self.client.read_flow_run(run.id)
        since, why = self.cancelled.get(number, (None, ""))
        if run.state is not None and run.state.is_final():
            _ended(self.sweep, number, run, why)
            return True
        if since is not None:
            if time.monotonic() - since < CANCEL_GRACE_S:
                return False
            get_run_logger().warning("trial %d: flow run %s did not stop; no longer waiting", number, run.id)
            remote.fail_unfinished(self.sweep, number, why)
            return True
        why = self.overdue(run)
        if why:
            get_run_logger().warning("trial %d: %s; cancelling flow run %s", number, why, run.id)
            _cancel(self.client, [run], why)
            self.cancelled[number] = (time.monotonic(), why)
        return False

    def overdue(self, run: FlowRun) -> str | None:
        now = datetime.now(timezone.utc)
        if run.state is not None and run.state.type == StateType.RUNNING and run.start_time is not None:
            if (now - run.start_time).total_seconds() > self.trial_timeout_s:
                return f"ran longer than trial_timeout_s={self.trial_timeout_s:g}"
        elif run.start_time is None and (now - run.created).total_seconds() > self.queue_timeout_s:
            return (
                f"waited longer than queue_timeout_s={self.queue_timeout_s:g} for a slot of pool {self.pool} "
                "(is a worker of it running?)"
            )
        return None


def _submit(sweep: Sweep, deployment: str) -> tuple[int, FlowRun]:
    """Ask the study for a trial and submit it as a flow run of ``deployment`` (returns at once)."""
    number, params = remote.ask(sweep)
    name = f"{sweep.settings.study_name}-trial-{number}"
    try:
        run = run_deployment(
            deployment,
            parameters={"study_name": sweep.settings.study_name, "number": number, "storage": sweep.settings.storage},
            timeout=0,  # submit only: the pool's worker runs it when a slot is free
            flow_run_name=name,
            tags=["ntp", "sweep-trial", f"study:{sweep.settings.study_name}"],
        )
    except BaseException as exc:
        remote.fail_unfinished(sweep, number, f"its flow run could not be created: {type(exc).__name__}: {exc}")
        raise
    remote.set_runner(sweep, number, str(run.id))
    get_run_logger().info("trial %d %s: flow run %s (%s)", number, params, run.id, name)
    return number, run


def _adopt(sweep: Sweep, client: Any) -> dict[int, FlowRun]:
    """The trial flow runs a previous (interrupted) controller left going: wait for them rather than ask anew."""
    adopted = {}
    for number, run_id in remote.running_trials(sweep).items():
        try:
            adopted[number] = client.read_flow_run(UUID(run_id))
        except (ObjectNotFound, ValueError):
            remote.fail_unfinished(sweep, number, f"its flow run {run_id} no longer exists")
    return adopted


def _ended(sweep: Sweep, number: int, run: FlowRun, why: str) -> None:
    """A trial flow run reached a final state: the trial ends FAIL if its runner could not tell the study."""
    state = run.state
    if remote.fail_unfinished(sweep, number, why or f"its flow run {run.id} ended {state.type.value}: {state.message}"):
        get_run_logger().warning("trial %d: flow run %s ended %s without ending the trial", number, run.id, state.name)
    sweep.report(sweep.study, remote.trial_state(sweep, number))


def _cancel(client: Any, runs: list[FlowRun], why: str) -> None:
    """Stop unfinished trial flow runs: one not started yet is cancelled at once; for a started one the worker
    stops its process, which stops the trial's training job and ends the trial FAIL."""
    for run in runs:
        if run.state is None or not run.state.is_final():
            waiting = run.state is not None and run.state.type == StateType.SCHEDULED
            state = Cancelled(message=why) if waiting else Cancelling(message=why)
            client.set_flow_run_state(run.id, state, force=True)
