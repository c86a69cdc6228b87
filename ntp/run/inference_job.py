"""The host side of an inference job (``ntp predict``, ``ntp evaluate``): check the model against the store, resolve
the launch like training's, run the ranks (in this process for one, torchrun for several), and publish the export.

An export is written into a hidden staging folder beside ``--out`` and renamed to it when every rank has finished:
a reader never sees half a dataset, and a failed job leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import time
import uuid
from pathlib import Path

from ntp.engine.infer.exports import read_pairs, write_description
from ntp.engine.infer.inference import check_store, inference_config, load_saved
from ntp.engine.infer.predict import Request, check_export
from ntp.engine.tasks import task_for
from ntp.errors import ConfigError, WorkerFailed, is_input_error
from ntp.run.flags import config_to_argv
from ntp.run.launch import LineSink, leads, run_torchrun_job, stdout_to
from ntp.run.predict_worker import request_argv
from ntp.run.preflight import check_launch
from ntp.spec import LaunchSpec, resolve

#: Launch arguments of ntp.spec.resolve that inference takes as training does.
LAUNCH_KEYS = ("nnodes", "node_rank", "rdzv_endpoint", "device", "job_timeout_s", "interface", "job_id")


def inference_spec(
    model: str | Path,
    store: str | Path,
    *,
    any_store: bool = False,
    nproc: int | None = None,
    launch: dict | None = None,
    **options,
) -> LaunchSpec:
    """The launch of applying ``model`` to ``store`` (one process unless ``nproc``); ``launch``: the other
    arguments of ntp.spec.resolve; ``options``: ntp.engine.infer.inference.INFERENCE_OPTIONS. The model is checked
    against the store first (feature width, outputs, fingerprint)."""
    saved = load_saved(model)
    check_store(model, saved, store, any_store)
    cfg = inference_config(saved, store, **options)
    return resolve(cfg, nproc=nproc or 1, **{k: v for k, v in (launch or {}).items() if v is not None})


def check_request(spec: LaunchSpec, request: Request, overwrite: bool = False) -> None:
    """What the job will write and read is usable: found now, not after the forward pass."""
    from storage import open_store

    if not request.out:
        return
    out = Path(request.out)
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} exists; pass --overwrite to replace it, or another --out")
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {out} is a file; an export is a folder (a Parquet dataset or Zarr group): pass another path"
        )
    meta = open_store(spec.config.store).meta
    check_export(request.export, task_for(meta), request.fmt)
    if request.export == "scores":
        if not request.pairs:
            raise ConfigError(
                "--export scores needs --pairs FILE (node pairs: .npy [k, 2], .parquet with src/dst, or .csv)"
            )
        try:
            pairs = read_pairs(request.pairs)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if len(pairs) and (pairs.min() < 0 or pairs.max() >= meta.num_nodes):
            raise ConfigError(
                f"pairs file {request.pairs} has node ids outside [0, {meta.num_nodes}) of store "
                f"{spec.config.store}; pass ids of its nodes"
            )


def run_inference(
    spec: LaunchSpec, request: Request, *, overwrite: bool = False, on_line: LineSink = print, source: str | None = None
) -> dict:
    """Run the job; returns {"out", "world_size", "wall_s"}. Input errors are raised before any rank starts.
    ``source``: where the model came from (an MLflow URI), for the export's description."""
    check_launch(spec)
    check_request(spec, request, overwrite)
    out = Path(request.out) if request.out else None
    staging = _staging_folder(out, spec) if out else None
    t0 = time.perf_counter()
    try:
        _run_ranks(spec, dataclasses.replace(request, out=str(staging) if staging else None), on_line)
        if staging is not None and leads(spec):
            write_description(staging, _description(spec, request, source))
            _publish(staging, out)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"out": str(out) if out else None, "world_size": spec.world_size, "wall_s": time.perf_counter() - t0}


def _staging_folder(out: Path, spec: LaunchSpec) -> Path:
    """Beside ``out`` (a rename within one filesystem); named by the job id on several nodes, so all write there."""
    token = spec.job_id if spec.nnodes > 1 else uuid.uuid4().hex[:12]
    staging = out.parent / f".{out.name}.partial-{token}"
    staging.mkdir(parents=True, exist_ok=True)
    return staging


def _run_ranks(spec: LaunchSpec, request: Request, on_line: LineSink) -> None:
    if spec.mode == "single":
        from ntp.engine.infer.predict import run

        try:
            with stdout_to(on_line):
                run(spec.config, spec.device, request)
        except Exception as exc:
            if is_input_error(exc):
                raise
            raise WorkerFailed(f"inference failed: {type(exc).__name__}: {exc}") from exc
        return
    program = [
        "-m",
        "ntp.run.predict_worker",
        "--device",
        spec.device,
        *config_to_argv(spec.config),
        *request_argv(request),
    ]
    run_torchrun_job(spec, program, on_line=on_line)


def _publish(staging: Path, out: Path) -> None:
    if out.exists():  # --overwrite (checked before the job)
        shutil.rmtree(out)
    staging.rename(out)


def _description(spec: LaunchSpec, request: Request, source: str | None) -> dict:
    from storage import open_store

    meta = open_store(spec.config.store).meta
    return {
        "export": request.export,
        "model": source or str(Path(request.model).resolve()),
        "store": spec.config.store,
        "store_fingerprint": meta.fingerprint,
        "task_type": meta.task_type,
        "layer": request.layer,
        "pairs": request.pairs,
        "num_nodes": meta.num_nodes,
        "world_size": spec.world_size,
        "format": request.fmt,
        "layout": "a Zarr group, arrays indexed by node id"
        if request.fmt == "zarr"
        else "part-<rank>.parquet, one per rank in rank order (= node order for node exports)",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
