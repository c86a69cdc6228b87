"""Triton kernels run by Triton's interpreter (numpy on CPU tensors): a module's kernels are built for it when the
module is imported with TRITON_INTERPRET=1, so the module is reloaded with it set, and again without after."""

from __future__ import annotations

import contextlib
import importlib


@contextlib.contextmanager
def interpreted(module, monkeypatch):
    """``module`` reloaded with its kernels built for the interpreter, for the ``with`` block."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    try:
        yield importlib.reload(module)
    finally:
        monkeypatch.delenv("TRITON_INTERPRET")
        importlib.reload(module)
