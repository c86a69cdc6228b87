"""Where a store lives: a folder (on a local or shared filesystem) or a URL on object storage (``s3://bucket/key``).

The reader asks a location for the few things it needs (whether it exists, a small file's text, the sizes of the
files under a prefix, a Zarr group), so it never asks which kind it has. URLs go through fsspec, as Zarr 3 reads
them; S3 needs the ``s3`` extra (s3fs) and takes its credentials and server the way every AWS tool does:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (or a profile), ``AWS_DEFAULT_REGION``, and ``AWS_ENDPOINT_URL``
for an S3-compatible server other than AWS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import zarr

#: fsspec options per protocol: bounded waits (botocore's default connect timeout is 60 s, retried).
_OPTIONS: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}},
}
_EXTRAS = {"s3": "s3", "s3a": "s3"}


class Location(Protocol):
    """What the store reader needs from where a store lives."""

    is_local: bool

    def exists(self) -> bool: ...

    def read_text(self, name: str) -> str:
        """The text of file ``name`` under the location; FileNotFoundError if there is none."""

    def file_sizes(self, prefix: str) -> dict[str, int]:
        """{path relative to the location: size in bytes} of every file under ``prefix``."""

    def open_group(self) -> zarr.Group: ...


def is_url(store: str | os.PathLike[str]) -> bool:
    """Whether ``store`` is a URL (``scheme://...``) rather than a filesystem path."""
    return "://" in str(store)


def location_of(store: str | os.PathLike[str] | Location) -> Location:
    """The location ``store`` names: a URL, or a path (made absolute)."""
    if isinstance(store, (LocalLocation, UrlLocation)):
        return store
    return UrlLocation(str(store).rstrip("/")) if is_url(store) else LocalLocation(Path(store))  # type: ignore[arg-type]


@dataclass(frozen=True)
class LocalLocation:
    path: Path
    is_local = True

    def __str__(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.is_dir()

    def read_text(self, name: str) -> str:
        return (self.path / name).read_text()

    def file_sizes(self, prefix: str) -> dict[str, int]:
        sizes = {}
        for folder, _dirs, files in os.walk(self.path / prefix):
            for f in files:
                full = os.path.join(folder, f)
                sizes[os.path.relpath(full, self.path).replace(os.sep, "/")] = os.stat(full).st_size
        return sizes

    def open_group(self) -> zarr.Group:
        return zarr.open_group(str(self.path), mode="r")


@dataclass(frozen=True)
class UrlLocation:
    url: str
    is_local = False

    def __str__(self) -> str:
        return self.url

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    @property
    def options(self) -> dict[str, Any]:
        return _OPTIONS.get(self.protocol, {})

    def _fs(self):
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.url, **self.options)
        except ImportError as e:
            extra = _EXTRAS.get(self.protocol)
            hint = f"pip install 'ntp[{extra}]'" if extra else f"install the fsspec package for {self.protocol}://"
            raise ImportError(f"reading a store at {self.url} needs {hint} ({e})") from None
        return fs, root.rstrip("/")

    def exists(self) -> bool:
        fs, root = self._fs()
        return bool(fs.exists(root))

    def read_text(self, name: str) -> str:
        fs, root = self._fs()
        return fs.cat_file(f"{root}/{name}").decode()

    def file_sizes(self, prefix: str) -> dict[str, int]:
        fs, root = self._fs()
        found = fs.find(f"{root}/{prefix}", detail=True)
        return {path[len(root) + 1 :]: int(info["size"]) for path, info in found.items()}

    def open_group(self) -> zarr.Group:
        return zarr.open_group(self.url, mode="r", storage_options=self.options)
