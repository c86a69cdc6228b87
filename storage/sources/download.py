"""Download and unzip an OGB archive (official URL or a mirror) with timeouts."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Callable

from storage.lock import file_lock
from storage.schema import StoreError
from storage.sources.ogb_meta import OgbInfo

TIMEOUT_ENV = "NTP_DOWNLOAD_TIMEOUT"  # seconds without data before a download gives up (default 30)
_CHUNK = 1 << 20


def archive_url(info: OgbInfo, mirror: str | None) -> str:
    """The official URL, or <mirror>/<same zip name>."""
    return f"{mirror.rstrip('/')}/{info.zip_name}" if mirror else info.url


def fetch_ogb(
    info: OgbInfo, raw: Path, mirror: str | None, progress: Callable[[str], None], timeout: float | None = None
) -> Path:
    """Return the unzipped dataset folder under `raw`, downloading and unzipping if needed."""
    timeout = timeout or float(os.environ.get(TIMEOUT_ENV, "30"))
    folder = raw / info.download_name
    if (folder / "raw").is_dir():
        return folder
    raw.mkdir(parents=True, exist_ok=True)
    with file_lock(raw / f".{info.zip_name}.lock", progress):
        if (folder / "raw").is_dir():
            return folder
        _remove_leftovers(raw, info, progress)
        zip_path = raw / info.zip_name
        if not zip_path.is_file():
            _download(archive_url(info, mirror), zip_path, progress, timeout)
        _unzip(zip_path, raw, info, progress)
    return folder


def _remove_leftovers(raw: Path, info: OgbInfo, progress: Callable[[str], None]) -> None:
    """Under this zip's lock, its partial downloads and unzips belong to processes that died."""
    name = re.escape(info.zip_name)
    pattern = re.compile(rf"^(?:{name}\.part|\.{name}\.unzip)-[0-9a-f]{{8}}$")
    for p in raw.iterdir():
        if pattern.match(p.name) and not p.is_symlink():
            progress(f"removing {p}, left by a download that did not finish")
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _download(url: str, dest: Path, progress: Callable[[str], None], timeout: float) -> None:
    part = dest.with_name(f"{dest.name}.part-{uuid.uuid4().hex[:8]}")
    progress(f"downloading {url}")
    fix = (
        "check the network or pass --mirror URL (a folder serving the same zip), "
        "or unzip the dataset yourself and pass --from-dir"
    )
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done = 0
            while block := resp.read(_CHUNK):
                out.write(block)
                done += len(block)
                if done % (64 * _CHUNK) < _CHUNK:
                    progress(f"  {done >> 20} MiB" + (f" of {total >> 20} MiB" if total else ""))
        if total and done != total:
            raise StoreError(f"download of {url} stopped at {done} of {total} bytes. Fix: {fix}")
        os.replace(part, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise StoreError(f"cannot download {url}: {getattr(e, 'reason', e)}. Fix: {fix}") from None
    finally:
        part.unlink(missing_ok=True)


def _unzip(zip_path: Path, raw: Path, info: OgbInfo, progress: Callable[[str], None]) -> None:
    progress(f"unzipping {zip_path}")
    tmp = raw / f".{info.zip_name}.unzip-{uuid.uuid4().hex[:8]}"
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for member in zf.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise StoreError(f"{zip_path} holds an unsafe path {member!r}. Fix: delete it")
            zf.extractall(tmp)
        inner = tmp / info.download_name
        if not (inner / "raw").is_dir():
            raise StoreError(
                f"{zip_path} does not contain {info.download_name}/raw/. "
                "Fix: delete the zip and download it again (or check the mirror)"
            )
        os.replace(inner, raw / info.download_name)
    except zipfile.BadZipFile as e:
        zip_path.unlink(missing_ok=True)
        raise StoreError(
            f"{zip_path} is not a valid zip ({e}); it was deleted. Fix: prepare again to download it afresh"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
