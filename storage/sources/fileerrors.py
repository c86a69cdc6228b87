"""Low-level read errors of an input file (a truncated gzip, bad CSV, no permission) as a StoreError
naming the file and the fix, instead of a traceback from pyarrow, gzip, zlib or numpy."""

from __future__ import annotations

import errno
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TypeVar

import pyarrow as pa

from storage.schema import StoreError

T = TypeVar("T")

# ValueError: numpy's and pyarrow's (ArrowInvalid) complaints about malformed content.
READ_ERRORS = (OSError, EOFError, zlib.error, zipfile.BadZipFile, ValueError, pa.ArrowException)


def unreadable(path: Path | str, error: BaseException) -> StoreError:
    """The StoreError for an input file that could not be read."""
    if isinstance(error, PermissionError) or getattr(error, "errno", None) in (errno.EACCES, errno.EPERM):
        fix = "check its permissions: the user running `ntp data prepare` must be able to read it"
    elif isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        fix = "check the path: it must name an existing file"
    else:
        fix = (
            "the file is truncated or damaged: download (or export) it again; for a downloaded OGB "
            "dataset delete its folder under DATA_DIR/raw and prepare again"
        )
    return StoreError(f"{path}: cannot be read ({type(error).__name__}: {error}). Fix: {fix}")


@contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """Turn a read error inside the block into unreadable(path, error)."""
    try:
        yield
    except StoreError:
        raise
    except READ_ERRORS as e:
        raise unreadable(path, e) from None


def guarded(path: Path | str, items: Iterator[T]) -> Iterator[T]:
    """Iterate `items` (a reader of `path`), turning its read errors into StoreError."""
    with reading(path):
        yield from items
