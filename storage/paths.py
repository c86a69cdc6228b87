"""Where stores and raw downloads live, and how a store's path is derived from its inputs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def default_data_dir() -> Path:
    """$NTP_DATA_DIR if set, else ./data."""
    env = os.environ.get("NTP_DATA_DIR")
    return Path(env) if env else Path.cwd() / "data"


def options_digest(identity: dict[str, Any], options: dict[str, Any]) -> str:
    """12 hex chars of a hash of (source identity, build options)."""
    blob = json.dumps({"identity": identity, "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_store_path(data_dir: Path, name: str, digest: str) -> Path:
    """<data_dir>/stores/<name>-<digest>."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(data_dir) / "stores" / f"{safe}-{digest}"


def raw_dir(data_dir: Path) -> Path:
    """Folder for downloaded archives and their unzipped contents."""
    return Path(data_dir) / "raw"


def lock_path(target: Path) -> Path:
    """Lock file next to a store: <parent>/.<name>.lock."""
    return target.parent / f".{target.name}.lock"


def temp_prefix(target: Path) -> str:
    """Name prefix of in-progress build directories next to a store."""
    return f".{target.name}.tmp-"
