"""The training loop of one rank: epochs, evaluation, early stopping, checkpoints, records to the sinks."""

from __future__ import annotations

import copy
import dataclasses
import socket
import time
from pathlib import Path

import numpy as np

from ntp.engine.device.measure import host_pss_bytes, peak_memory_bytes, reset_peak_memory
from ntp.engine.distributed.collectives import all_gather_objects
from ntp.engine.distributed.dist import distributed
from ntp.engine.tasks.base import Best, Job
from ntp.engine.train import checkpoint
from ntp.engine.train.schedule import Schedule
from ntp.engine.train.setup import DataLoader, setup
from ntp.engine.train.sinks import RecordSink, default_sinks
from ntp.errors import CheckpointError, TrainingError
from ntp.records import EpochRecord, FinalRecord, WorkerStats
from ntp.spec import LaunchSpec


# -- one epoch ------------------------------------------------------------------------------------------------------
def train_step(job: Job, epoch: int) -> float:
    """Forward, backward and update(s) of the job's task; the global mean loss (the same on every rank)."""
    return job.task.train_epoch(job, epoch)


def evaluate_splits(job: Job) -> dict[str, float]:
    """The metric on train/valid/test (the same on every rank)."""
    return job.task.evaluate(job)


def worker_stats(job: Job, epoch_s: float, cpu_s: float) -> WorkerStats:
    """This rank's record of the epoch that just ran."""
    stats, ctx = job.comm.stats, job.ctx
    phases = ctx.memory.snapshot()
    ctx.memory.release_free_heap()  # host PSS below: what stays resident, not heap that malloc has yet to return
    # resetting per-phase peaks also resets the process's: where phases were measured, the epoch peak is theirs
    peak = max(phases.values()) if phases else peak_memory_bytes(job.env.device)
    return WorkerStats(
        rank=job.env.rank,
        compute_s=max(epoch_s - stats.total_seconds, 0.0),
        comm_s=dict(stats.seconds),
        bytes_sent=dict(stats.bytes_sent),
        bytes_recv=dict(stats.bytes_recv),
        peak_mem_bytes=peak,
        peak_mem_by_phase=phases,
        cpu_s=cpu_s,
        chunks=ctx.plan.num_chunks,
        overlap_s=ctx.clock.overlap_s,
        overlapped=ctx.overlapped,
        nn_device=str(ctx.nn_device),
        offload=ctx.offload,
        host_pss_bytes=host_pss_bytes(),
        topology_bytes=ctx.topology.nbytes(),
        device_topology_bytes=ctx.device_topology_bytes(),
        host=socket.gethostname(),
    )


# -- the loop ---------------------------------------------------------------------------------------------------------
def fit(job: Job, sinks: list[RecordSink] | None = None) -> FinalRecord:
    """Train for cfg.epochs (or until early stopping); returns the final record. Rank 0 writes every record to
    ``sinks`` (default: the results file of the config and the console)."""
    cfg, env = job.cfg, job.env
    job.schedule = Schedule(cfg, job.optimizer)
    start = _maybe_resume(job)
    sinks = sinks if sinks is not None else default_sinks(cfg, env.is_main)
    if not env.is_main:
        sinks = []
    for sink in sinks:
        sink.start(job.history)
    stale, gathered = 0, False
    for epoch in range(start, cfg.epochs):
        if epoch == cfg.fail_at_epoch and env.rank == cfg.fail_rank:
            raise TrainingError(f"injected failure on rank {env.rank} at epoch {epoch} (--fail-rank/--fail-at-epoch)")
        saving = cfg.checkpoint_due(epoch)
        rec = _run_epoch(job, epoch, saving)
        best = _is_best(job, rec)
        if best:
            if not saving:  # every rank: the state kept is whole (a checkpoint's epoch gathered it already)
                job.task.gather_state(job)
            _keep(job, rec)
            stale = 0
        elif rec.test_metric is not None:  # an evaluated epoch, no better
            stale += 1
        gathered = best or saving
        job.schedule.step(epoch, rec.valid_metric)
        job.history.append(rec)
        for sink in sinks:
            sink.write(rec)
        if env.is_main and saving:
            checkpoint.save_checkpoint(cfg.checkpoint_dir, epoch, _state(job))
        if cfg.patience and stale >= cfg.patience:
            break
    final = FinalRecord(
        best_epoch=job.best.epoch,
        best_valid_metric=_finite(job.best.valid),
        test_metric=job.best.test,
        metric=job.data.metric,
        task_type=job.data.task_type,
        world_size=env.world,
        target_type=job.task.target_type(job),
        epochs_run=len(job.history),
        store_fingerprint=job.data.fingerprint,
        config=cfg.to_dict(),
    )
    if cfg.model_out and job.best.state is None and not gathered:  # nothing kept: the last weights, whole
        job.task.gather_state(job)
    if env.is_main and cfg.model_out:
        save_model(job, cfg.model_out)
    for sink in sinks:
        sink.write(final)
        sink.close()
    return final


def _run_epoch(job: Job, epoch: int, saving: bool) -> EpochRecord:
    """Train, measure and evaluate one epoch; ``saving``: a checkpoint follows, so its whole state is gathered."""
    cfg, env = job.cfg, job.env
    job.comm.stats.reset()
    reset_peak_memory(env.device)
    job.ctx.reset_stats()
    lr = job.schedule.lr()
    t0, cpu0 = time.perf_counter(), time.process_time()
    loss = train_step(job, epoch)
    if saving:  # every rank, in the epoch's traffic: the checkpoint holds whole tables and moments
        job.task.gather_state(job, with_optimizer=True)
    epoch_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    if not np.isfinite(loss):
        raise TrainingError(
            f"loss became {loss} at epoch {epoch}; lower --lr (now {cfg.lr}) or check the "
            f"store's features for NaN/inf (`ntp data info {cfg.store}`)"
        )
    mine = worker_stats(job, epoch_s, cpu_s)
    evaluated = (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1
    t1 = time.perf_counter()
    metrics = evaluate_splits(job) if evaluated else {}
    eval_s = time.perf_counter() - t1 if evaluated else None
    workers = all_gather_objects(mine)
    return EpochRecord(
        epoch=epoch,
        loss=loss,
        epoch_s=epoch_s,
        train_metric=metrics.get("train"),
        valid_metric=metrics.get("valid") if job.cfg.holds_out_valid else None,  # else: no valid split left
        test_metric=metrics.get("test"),
        valid_loss=metrics.get("valid_loss"),
        lr=lr,
        eval_s=eval_s,
        workers=workers,
    )


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def _is_best(job: Job, rec: EpochRecord) -> bool:
    """An evaluated epoch whose weights are the best so far: by validation metric (or loss, --monitor loss), or,
    with nothing held out (--fit-on train+valid), the latest, as the papers that train so report their last epoch."""
    if rec.test_metric is None:
        return False
    if not job.cfg.holds_out_valid:
        return True
    if job.cfg.monitor == "loss":
        return rec.valid_loss is not None and rec.valid_loss < job.best.valid_loss  # (False for NaN)
    valid = rec.valid_metric
    return valid is not None and not np.isnan(valid) and valid > job.best.valid


def _keep(job: Job, rec: EpochRecord) -> None:
    """Keep ``rec``'s epoch as the best, with a copy of its (gathered) weights."""
    job.best = Best(
        epoch=rec.epoch,
        valid=rec.valid_metric if job.cfg.holds_out_valid else float("-inf"),
        test=rec.test_metric,
        valid_loss=rec.valid_loss if rec.valid_loss is not None else float("inf"),
        state=copy.deepcopy({k: v.detach().cpu() for k, v in job.model.state_dict().items()}),
    )


def _state(job: Job) -> dict:
    """A checkpoint: plain dicts and tensors only (loaded with weights_only=True)."""
    return {
        "model": job.model.state_dict(),
        "optimizer": job.optimizer.state_dict(),
        "schedule": job.schedule.state_dict(),
        "best": dataclasses.asdict(job.best),
        "history": [dataclasses.asdict(r) for r in job.history],
        "config": job.cfg.to_dict(),
        "store_fingerprint": job.data.fingerprint,
    }


def _maybe_resume(job: Job) -> int:
    if not job.cfg.resume:
        return 0
    say = (lambda m: print(m, flush=True)) if job.env.is_main else (lambda m: None)  # once per job, not per rank
    found = checkpoint.latest_loadable(job.cfg.checkpoint_dir, job.env.device, say)
    if found is None:
        return 0  # nothing to resume from yet: a fresh start
    path, state = found
    checkpoint.check_resumable(state, path, job.cfg, job.data.fingerprint, say)
    _restore(job, path, state)
    done = int(state["epoch"]) + 1
    say(f"[ntp] resuming from {path}: {done} of {job.cfg.epochs} epochs done")
    return done


def _restore(job: Job, path: Path, state: dict) -> None:
    from ntp.records import from_dict

    # the groups' options as built today win over the saved ones (lr, decay, a row-wise group's own settings)
    today = [{k: v for k, v in group.items() if k != "params"} for group in job.optimizer.param_groups]
    try:
        job.model.load_state_dict(state["model"])
        job.optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError) as exc:  # --resume-anyway with another model shape
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(
            f"the weights of checkpoint {path} do not fit this model ({detail}); "
            "--resume-anyway cannot change its shape (--model, --arch, --hidden, --nn-layers, "
            "--heads, --norm): keep them, or start afresh in another --checkpoint-dir"
        ) from exc
    for group, options in zip(job.optimizer.param_groups, today):
        group.update(options)
    job.schedule.resume(int(state["epoch"]) + 1, state.get("schedule"))
    job.best = Best(**state["best"])
    job.history[:] = [from_dict(r) for r in state["history"]]


def save_model(job: Job, path: str | Path) -> Path:
    """The best model: weights plus what rebuilds it (config, widths, store fingerprint)."""
    state = job.best.state or {k: v.detach().cpu() for k, v in job.model.state_dict().items()}
    return checkpoint.atomic_save(
        {
            "config": job.cfg.to_dict(),
            "state_dict": state,
            "in_dim": job.data.feature_dim,
            "out_dim": job.data.out_dim,
            "store_fingerprint": job.data.fingerprint,
            "metric": job.data.metric,
            "best_epoch": job.best.epoch,
        },
        path,
    )


def run(spec: LaunchSpec, load: DataLoader | None = None, sinks: list[RecordSink] | None = None) -> FinalRecord:
    """Train ``spec.config`` on this process (one rank of the job torchrun started, or a lone process)."""
    with distributed(spec.config.collective_timeout_s, spec.device) as env:
        return fit(setup(spec.config, env, load), sinks)
