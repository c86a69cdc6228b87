"""Temporary folders of ntp's processes (a torchrun job's logs and error files, torch's compile cache).

Each is named ``<prefix><host>-<pid>-<random>`` and removed by its process at the end. A process killed outright
(SIGKILL, the OOM killer) cannot remove its own, so every new one first removes this host's folders of the same
prefix whose process is gone; other hosts' folders (a temporary directory shared by several hosts) are left alone.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
from pathlib import Path


def owned_tempdir(prefix: str) -> tempfile.TemporaryDirectory:
    """A new temporary folder named after this host and process, once the leftovers of ``prefix`` are removed."""
    mine = f"{prefix}{socket.gethostname()}-"
    for folder in Path(tempfile.gettempdir()).glob(glob.escape(mine) + "*"):
        pid = folder.name[len(mine) :].split("-", 1)[0]
        if pid.isdigit() and folder.is_dir() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{mine}{os.getpid()}-", ignore_cleanup_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
