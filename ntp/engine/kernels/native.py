"""The project's C kernels (``ntp/engine/kernels/csrc``), built by ``pip install`` as the library ``ntp.engine.kernels._native`` and
loaded with ctypes: plain C, no Python API, and every call runs without the GIL, on OpenMP's threads (torch's own
pool: the library names libgomp, which the dynamic loader finds already loaded by torch). Where the library is
missing (a source tree never installed) or ``NTP_NATIVE=0`` is set, :func:`library` is None and callers take
torch's ops, which give the same values."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import torch

#: what the kernels' ``dtype`` argument calls each dtype they take
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_i64, _u64, _int, _u32, _f32, _ptr = (
    ctypes.c_int64,
    ctypes.c_uint64,
    ctypes.c_int,
    ctypes.c_uint32,
    ctypes.c_float,
    ctypes.c_void_p,
)
_SIGNATURES = {
    "ntp_dropout": [
        _int,
        _int,
        _ptr,
        _i64,
        _ptr,
        _ptr,
        _ptr,
        _ptr,
        _i64,
        _i64,
        _i64,
        _i64,
        _u64,
        _int,
        _u32,
        _f32,
        _int,
    ],
    "ntp_masked_scale": [_int, _int, _ptr, _ptr, _ptr, _i64, _f32],
}


def enabled() -> bool:
    """Whether the project's kernels may run: ``NTP_NATIVE=0`` switches them off (these, and the Triton kernel on
    CUDA: ntp.engine.kernels.cuda_dropout)."""
    return os.environ.get("NTP_NATIVE", "1") != "0"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they are not built or switched off."""
    if not enabled():
        return None
    spec = importlib.util.find_spec("ntp.engine.kernels._native")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)
    for name, argtypes in _SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = None
    return lib
