"""Atomic checkpoints and the saved model (weights plus what is needed to rebuild it); what resuming checks
(a loadable checkpoint, the same options and store) and where a run may write."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ntp.config import RESUMABLE_CHANGES, TrainConfig
from ntp.errors import CheckpointError, ConfigError
from ntp.options import flag

_NAME = re.compile(r"^ckpt-(\d{6})\.pt$")
#: What every checkpoint holds (one without them was not written by save_checkpoint, or is damaged).
_KEYS = ("epoch", "model", "optimizer", "best", "history", "config")
Warn = Callable[[str], None]


def atomic_save(obj: Any, path: str | Path) -> Path:
    """torch.save to a temporary file in the same directory, fsync, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_checkpoint(directory: str | Path, epoch: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``ckpt-<epoch>.pt`` and keep only the newest ``keep`` checkpoints."""
    path = atomic_save({"epoch": epoch, **state}, Path(directory) / f"ckpt-{epoch:06d}.pt")
    for old in sorted(_checkpoints(directory))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = sorted(_checkpoints(directory))
    return found[-1] if found else None


def load(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


def latest_loadable(directory: str | Path, device: torch.device | str, warn: Warn) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, and its state; a damaged one is skipped with a warning. None: there is
    no checkpoint (a fresh start); CheckpointError: there are some, but none loads."""
    problems = []
    for path in reversed(sorted(_checkpoints(directory))):
        try:
            state = load(path, device)
            missing = [key for key in _KEYS if key not in state]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            return path, state
        except Exception as exc:  # torch raises several types for a truncated or corrupt file
            reason = f"truncated or damaged: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            problems.append(f"{path.name} ({reason})")
            warn(f"[ntp] warning: checkpoint {path} cannot be loaded ({reason}); skipping it for an earlier one")
    if problems:
        raise CheckpointError(
            f"no checkpoint in {directory} can be loaded: {'; '.join(problems)}. Delete them to "
            "start afresh, or pass --checkpoint-dir of a run to resume"
        )
    return None


def check_resumable(state: dict, path: Path, cfg: TrainConfig, store_fingerprint: str, warn: Warn) -> None:
    """Refuse to resume ``state`` with options (or a store) other than those it was trained with, unless
    ``cfg.resume_anyway``: a changed lr or model would otherwise be silently ignored or mixed in."""
    changes = config_changes(state["config"], cfg, path)
    saved_fp = state.get("store_fingerprint")
    if saved_fp is None:
        warn(
            f"[ntp] warning: checkpoint {path} has no store fingerprint (written by an older version): whether it "
            f"was trained on store {cfg.store or '(in memory)'} is unknown"
        )
    elif saved_fp and store_fingerprint and saved_fp != store_fingerprint:
        changes.append(f"store fingerprint {saved_fp} -> {store_fingerprint} ({cfg.store})")
    if changes and not cfg.resume_anyway:
        raise CheckpointError(
            f"--resume: checkpoint {path} was written with other options: {'; '.join(changes)}. "
            "Resume with the same options and store, start afresh in another --checkpoint-dir, "
            "or pass --resume-anyway to continue from it with the new ones"
        )
    if changes:
        warn(f"[ntp] warning: --resume-anyway: continuing from {path} with {'; '.join(changes)}")


def config_changes(saved: dict, cfg: TrainConfig, path: Path) -> list[str]:
    """``--option old -> new`` for each field that differs from the saved config and may not change on resume."""
    try:
        old = TrainConfig.from_dict(saved).to_dict()  # old key names become today's
    except ConfigError as exc:
        raise CheckpointError(
            f"checkpoint {path} holds a configuration this version cannot read ({exc}); "
            "start afresh in another --checkpoint-dir"
        ) from exc
    new = cfg.to_dict()
    return [
        f"--{flag(name)} {old[name]!r} -> {new[name]!r}"
        for name in new
        if name not in RESUMABLE_CHANGES and old[name] != new[name]
    ]


def check_no_earlier_run(directory: str | Path) -> None:
    """A new run (no --resume) starts in a checkpoint folder without checkpoints: one holding an earlier run's would
    mix the two, and its later epochs would be kept over the new run's (only the newest are kept) and resumed."""
    latest = latest_checkpoint(directory)
    if latest is not None:
        done = int(_NAME.match(latest.name).group(1)) + 1
        raise ConfigError(
            f"--checkpoint-dir {directory} holds checkpoints of an earlier run (the latest: {latest.name}, {done} "
            "epochs done). Fix: add --resume to continue that run, or pass a new or empty --checkpoint-dir"
        )


def check_output_paths(cfg: TrainConfig) -> None:
    """Everything the run writes can be written: found now, not after training."""
    for option, path, kind, example in (
        ("--model-out", cfg.model_out, "file", "model.pt"),
        ("--results", cfg.results, "file", "results.jsonl"),
        ("--checkpoint-dir", cfg.checkpoint_dir, "dir", ""),
    ):
        if path:
            _check_writable(option, Path(path), kind, example)


def _check_writable(option: str, path: Path, kind: str, example: str) -> None:
    if kind == "file" and path.is_dir():
        raise ConfigError(
            f"{option} {path} is an existing directory; it names a file: pass e.g. {option} {path / example}"
        )
    if kind == "dir" and path.exists() and not path.is_dir():
        raise ConfigError(
            f"{option} {path} is an existing file; it names a directory: pass another path (or move the file)"
        )
    folder = path if kind == "dir" else path.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {path}: its directory {folder} cannot be created, as {existing} is a file; "
            "pass a path in a writable directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: {existing} is not writable; pass a path in a writable directory")


def _checkpoints(directory: str | Path) -> list[Path]:
    d = Path(directory)
    return [p for p in d.iterdir() if _NAME.match(p.name)] if d.is_dir() else []
