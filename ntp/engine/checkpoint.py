"""Atomic checkpoints and the saved model (weights plus what is needed to rebuild it)."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^ckpt-(\d{6})\.pt$")


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


def _checkpoints(directory: str | Path) -> list[Path]:
    d = Path(directory)
    return [p for p in d.iterdir() if _NAME.match(p.name)] if d.is_dir() else []
