"""What the project's Triton kernels on CUDA share (ntp.engine.kernels.cuda_dropout, ntp.engine.kernels.cuda_transpose): Triton where
it imports, launching on a tensor's own GPU, and the decision whether a kernel runs on a GPU: Triton there, the
project's kernels not switched off (``NTP_NATIVE=0``), and the kernel's first result there, checked once, equal to
what torch computes. Where not, the caller takes torch's ops, and the log says why."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable

import torch

from ntp.engine.kernels import native

log = logging.getLogger(__name__)

_missing = ""  # why Triton does not import, where it does not
try:
    import triton
    import triton.language as tl
except Exception as e:  # none (a CPU build of torch), or one that does not import: torch's ops
    triton, tl, _missing = None, None, f"{type(e).__name__}: {e}"


def on_gpu_of(t: torch.Tensor):
    """A context in which Triton launches on ``t``'s GPU (it launches on the current one); none for the CPU tensors
    Triton's interpreter takes (the tests)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def works(device: torch.device, check: Callable[[torch.device], None], what: str) -> bool:
    """Whether a kernel runs on ``device``: a GPU, Triton, ``NTP_NATIVE`` not 0, and ``check(gpu)`` (which raises
    where the kernel's result differs from torch's) passing the first time it is asked for that GPU. ``what`` names
    the fallback in the log."""
    if device.type != "cuda" or not native.enabled():
        return False
    return checked(
        torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index), check, what
    )


@functools.cache
def checked(device: torch.device, check: Callable[[torch.device], None], what: str) -> bool:
    """``check`` on ``device``, once: False, with a warning naming ``what`` takes over, where Triton is missing or the
    check fails (the kernel's build or launch, or a wrong result: the slower path is still right)."""
    try:
        if triton is None:
            raise RuntimeError(f"Triton does not import ({_missing})")
        check(device)
    except Exception as e:
        log.warning(
            "%s (the same results, more passes over memory): its Triton kernel failed: %s: %s",
            what,
            type(e).__name__,
            e,
        )
        return False
    return True
