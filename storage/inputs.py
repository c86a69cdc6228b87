"""Content identity of input files: a streamed BLAKE2b of every byte, so a store is reused only when
its inputs hold the same bytes (an edit that keeps a file's size still changes its key).

Hashing is a separate pass before the build (the reuse decision must be made before reading).
Digests are cached by (path, device, inode, size, mtime, ctime): any write to a file changes its
ctime, which no user call can set back. As git does for its index, a file changed within the last
few seconds is not cached, so a coarse timestamp cannot hide a later write in the same tick.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable

from storage.sources.fileerrors import reading

BLOCK = 1 << 20
CACHE_ENV = "NTP_CACHE_DIR"  # where the digest cache lives (default $XDG_CACHE_HOME/ntp or ~/.cache/ntp)
RACY_SECONDS = 3.0
MAX_ENTRIES = 20_000


def cache_file() -> Path:
    base = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ntp"
    return Path(base) / "input-digests.json"


def _stat_key(path: Path, st: os.stat_result) -> str:
    return f"{path}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _hash_file(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with reading(path), open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


class Digests:
    """Content digests of files, with the on-disk cache loaded once and saved once."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.path = cache_file()
        self.cache = self._load()
        self.dirty = False

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # no cache or a damaged one: hash again
        return data if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()) else {}

    def of(self, path: Path) -> str:
        """The content digest of one file."""
        with reading(path):
            st = path.stat()
        key = _stat_key(path, st)
        if key in self.cache:
            return self.cache[key]
        self.progress(f"hashing {path} ({st.st_size / 2**20:,.1f} MiB)")
        digest = _hash_file(path)
        if time.time() - max(st.st_mtime, st.st_ctime) > RACY_SECONDS and _stat_key(path, path.stat()) == key:
            self.cache[key] = digest
            self.dirty = True
        return digest

    def save(self) -> None:
        """Write the cache atomically; a cache that cannot be written is only a lost speed-up."""
        if not self.dirty:
            return
        entries = list(self.cache.items())[-MAX_ENTRIES:]
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(dict(entries)))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


def file_identity(path: Path, digests: Digests) -> list:
    """[path, digest] of a file, or [path, {name: digest}] of a folder's files (e.g. a splits folder)."""
    if path.is_dir():
        return [str(path), {q.name: digests.of(q) for q in sorted(path.iterdir()) if q.is_file()}]
    return [str(path), digests.of(path)]


def tree_identity(root: Path, subdirs: tuple[str, ...], digests: Digests) -> dict[str, str]:
    """Relative path -> digest of every file under root/<subdir> for each subdir."""
    return {
        str(p.relative_to(root)): digests.of(p)
        for sub in subdirs
        if (root / sub).is_dir()
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }
