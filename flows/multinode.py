"""The `train-multinode` flow: one training job across several hosts, one node job per host, all one logical run.

The parent submits a run of the node-job deployment (the `train` flow, `train/train-node` in prefect.yaml) per host,
each to that host's work queue (where only that host's worker takes it; the queue's limit 1 keeps two trainings off
the same GPUs), with its node rank, the same rendezvous endpoint and the same job id. Node 0 hosts the rendezvous
and tracks the job in MLflow (one parent run, a child run per rank). The parent then watches them: when one fails,
crashes or is cancelled, or the job's time is up, it cancels the others (their workers stop the torchrun jobs) and
fails with that node's error, which carries the failing rank's traceback.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from flows.params import LaunchOptions, TrainingOptions
from ntp.config import TrainConfig
from ntp.run.launch import PEER_FAILURES
from ntp.run.worker import FAILURE_BEGIN
from ntp.spec import derived_job_id

#: Seconds a node job may wait for its host's worker and start, on top of the job's own time limit.
START_SLACK_S = 600.0
#: After the first node job fails, how long to let the others end by themselves (to blame the one that failed
#: first-hand, not a peer that lost its connection to it).
GRACE_S = 15.0
_FINAL_BAD = (StateType.FAILED, StateType.CRASHED, StateType.CANCELLED, StateType.CANCELLING)


class NodeJobFailed(RuntimeError):
    """A node job of a multi-node training failed; the message holds its error (the failing rank's traceback)."""


@flow(name="train-multinode")
def train_multinode(
    store: str,
    hosts: list[str],
    rdzv_endpoint: str,
    training: TrainingOptions = TrainingOptions(),  # type: ignore[valid-type]
    launch: LaunchOptions = LaunchOptions(),
    experiment: str | None = None,
    node_deployment: str = "train/train-node",
    poll_s: float = 2.0,
) -> dict[str, Any]:
    """Train on ``store`` (a path every host sees, or an s3:// URL) with one node per entry of ``hosts`` (the work
    queue of that host's worker; node 0 on ``hosts[0]``), ``launch.nproc`` processes each, the rendezvous at
    ``rdzv_endpoint`` (an address of ``hosts[0]`` the others reach). Returns the job id, the node flow runs and
    node 0's MLflow run id."""
    logger = get_run_logger()
    if len(hosts) < 2 or len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts {hosts}: name two or more different hosts (one work queue each)")
    node_launch = launch.model_copy(update={"nnodes": len(hosts), "rdzv_endpoint": rdzv_endpoint, "retries": 0})
    # named here, not resolved: this (control) host may have no GPU while the nodes train on theirs
    job_id = launch.job_id or derived_job_id(
        TrainConfig.from_dict({**training.model_dump(exclude_unset=True), "store": store}), rdzv_endpoint
    )
    runs = []
    for rank, host in enumerate(hosts):
        params = {
            "store": store,
            "training": training.model_dump(exclude_unset=True),  # a model's own defaults apply on every node
            "experiment": experiment,
            "launch": node_launch.model_copy(update={"node_rank": rank, "job_id": job_id}).model_dump(),
        }
        runs.append(
            run_deployment(
                node_deployment,
                parameters=params,
                work_queue_name=host,
                timeout=0,
                flow_run_name=f"{job_id}-node-{rank}",
                tags=["ntp", f"node-{rank}"],
            )
        )
        logger.info("node %d: flow run %s on work queue %s", rank, runs[-1].id, host)
    deadline = time.monotonic() + (launch.job_timeout_s or 24 * 3600.0) + START_SLACK_S
    watch_node_jobs(runs, hosts, deadline, poll_s)
    run_id = mlflow_run_of(runs[0].id)
    logger.info("job %s done on %d nodes; MLflow run %s", job_id, len(hosts), run_id)
    return {"job_id": job_id, "node_flow_runs": [str(run.id) for run in runs], "run_id": run_id}


def mlflow_run_of(flow_run_id: Any) -> str | None:
    """The MLflow training run node 0's flow run tracked (tagged with its flow run id)."""
    from ntp.run.tracking import client
    from ntp.run.tracking.mlflow_store import TAG_FLOW_RUN, TAG_KIND

    c = client()
    experiments = [e.experiment_id for e in c.search_experiments()]
    found = c.search_runs(experiments, f"tags.`{TAG_FLOW_RUN}` = '{flow_run_id}' and tags.`{TAG_KIND}` = 'train'")
    return found[0].info.run_id if found else None


def watch_node_jobs(runs: list[FlowRun], hosts: list[str], deadline: float, poll_s: float) -> list[FlowRun]:
    """Wait until every node job completes; on the first that does not, or at ``deadline``, cancel the rest and
    raise :class:`NodeJobFailed` naming that node and its error."""
    with get_client(sync_client=True) as client:
        while True:
            current = [client.read_flow_run(run.id) for run in runs]
            if any(_ended_badly(run) for run in current):
                current = _settle(client, current)
                bad = _blame(current)
                _cancel(client, current)
                state = current[bad].state
                raise NodeJobFailed(
                    f"node {bad} (work queue {hosts[bad]}, flow run {current[bad].id}) ended "
                    f"{state.type.value}: {state.message}; every other node job still running "
                    "was cancelled"
                )
            if all(run.state and run.state.type == StateType.COMPLETED for run in current):
                return current
            if time.monotonic() > deadline:
                _cancel(client, current)
                late = [i for i, run in enumerate(current) if not (run.state and run.state.is_final())]
                raise NodeJobFailed(
                    f"node(s) {late} did not finish in time (are the workers of work queues "
                    f"{[hosts[i] for i in late]} running?); every node job was cancelled"
                )
            time.sleep(poll_s)


def _ended_badly(run: FlowRun) -> bool:
    return run.state is not None and run.state.type in _FINAL_BAD


def _settle(client: Any, runs: list[FlowRun]) -> list[FlowRun]:
    """The node jobs once every one has ended, or after GRACE_S."""
    deadline = time.monotonic() + GRACE_S
    while not all(run.state and run.state.is_final() for run in runs) and time.monotonic() < deadline:
        time.sleep(1.0)
        runs = [client.read_flow_run(run.id) for run in runs]
    return runs


def _blame(runs: list[FlowRun]) -> int:
    """The node whose error is first-hand (a rank's own traceback), else the first that ended badly."""
    bad = [i for i, run in enumerate(runs) if _ended_badly(run)]
    for i in bad:
        message = runs[i].state.message or ""
        if FAILURE_BEGIN in message and not any(peer in message for peer in PEER_FAILURES):
            return i
    return bad[0]


def _cancel(client: Any, runs: list[FlowRun]) -> None:
    """Ask every unfinished node job to stop: its worker kills the flow run's process, whose launcher stops the
    torchrun job."""
    for run in runs:
        if run.state is None or not run.state.is_final():
            client.set_flow_run_state(run.id, Cancelling(message="another node of the job failed"), force=True)
