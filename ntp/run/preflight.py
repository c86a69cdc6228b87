"""Checks made before any rank starts: the store opens and has something to train on, the output paths can be
written (and a new run's checkpoint folder holds no earlier run's), a resumed checkpoint loads and fits the options,
and the memory plan of an explicit budget can work.

A problem found here is the user's input (StoreError, ConfigError, MemoryPlanError): it is reported at once, with
its fix, instead of inside epoch 0 of every rank, and schedulers do not retry it.
"""

from __future__ import annotations

from ntp.engine.memory.chunks import ChunkPlan, uniform_plan
from ntp.engine.tasks import task_for
from ntp.engine.train import checkpoint
from ntp.engine.train.setup import open_training_store
from ntp.spec import LaunchSpec


def check_launch(spec: LaunchSpec) -> ChunkPlan | None:
    """Open the store (its own message if it is missing or damaged), check the run's inputs and outputs, and compute
    the chunk plan that an explicit ``--chunk-rows`` or ``--memory-budget`` asks for (raising MemoryPlanError when
    it cannot work). Returns that plan, or None when the plan is left to each rank's free device memory."""
    cfg = spec.config
    store = open_training_store(cfg)
    task = task_for(store.meta)
    task.check_store(cfg, store)
    checkpoint.check_output_paths(cfg)
    if cfg.resume:
        _check_resume(spec, store.meta)
    elif cfg.checkpoint_dir:
        checkpoint.check_no_earlier_run(cfg.checkpoint_dir)
    if cfg.chunk_rows:
        return uniform_plan(store.meta.num_nodes, cfg.chunk_rows)
    return task.plan(cfg, store, spec.world_size, spec.device, spec.mode)


def _check_resume(spec: LaunchSpec, meta) -> None:  # noqa: ANN001 (storage's StoreMeta)
    """The checkpoint a rank would resume from loads and fits the options (as the ranks resolve them for the store's
    task); the ranks warn about what they skip."""
    cfg = spec.config.for_task(meta.task_type)
    found = checkpoint.latest_loadable(cfg.checkpoint_dir, "cpu", lambda message: None)
    if found is not None:
        path, state = found
        checkpoint.check_resumable(state, path, cfg, meta.fingerprint, lambda message: None)
