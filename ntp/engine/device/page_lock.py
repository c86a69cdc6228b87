"""Page-locking host memory that a GPU reads in place (``--offload``'s streamed topology): copies from locked pages run
at the bus's speed without a staging copy. Only pages that hold nothing but the tensor's storage are locked, all of
them: a lock covers whole pages, and CUDA refuses, as "invalid argument", a copy from host memory that is partly
locked and partly not (the driver's rule for cuMemcpy, which a page shared with another object, or the rest of a
view's storage, would break for that object's copies)."""

from __future__ import annotations

import ctypes
import mmap
import weakref

import torch

#: cuMemHostRegister's flag: the device only reads the pages, so they are locked without write access (a shared
#: mapping of the topology stays the one copy a machine's ranks share; ntp.engine.graph.node_shared maps it so)
_READ_ONLY = 0x08
#: bytes from which glibc's malloc gives an allocation a mapping of its own (its threshold grows with use, to 32 MiB
#: at most on 64-bit systems); a smaller one may lie in the heap, its first and last pages shared with other objects.
#: An H100 raised CUDA's "invalid argument" in 3 of 4 runs of test_cuda.py's chunked offload cases, whose topologies
#: were a few KB locked on such pages (locking a 480 MB topology never failed): the rule above would explain it, not
#: yet shown on a GPU; staging what is smaller costs a copy of under 32 MiB
_OWN_MAPPING_BYTES = 32 << 20
_driver_lib = None


def pin_read_only(t: torch.Tensor, device: torch.device) -> bool:
    """Page-lock the host memory of ``t``'s storage for ``device`` to read (the CUDA driver's cuMemHostRegister,
    read-only), until ``t`` is collected. False where the driver refuses (no read-only registration on this system, pages
    already registered) or :func:`owns_its_pages` does not hold: the caller stages. The driver's API, not the
    runtime's: a refusal there would stay as the runtime's last error, which the next kernel launch raises."""
    lib = _driver()
    if lib is None or t.device.type != "cpu" or not owns_its_pages(t):
        return False
    torch.cuda.synchronize(device)  # the device's context is current on this thread
    start, end = _pages(t)
    register = getattr(lib, "cuMemHostRegister_v2", None) or lib.cuMemHostRegister
    if register(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_uint(_READ_ONLY)):
        return False
    weakref.finalize(t, lib.cuMemHostUnregister, ctypes.c_void_p(start))
    return True


def owns_its_pages(t: torch.Tensor) -> bool:
    """Whether the pages of the host tensor ``t``'s storage hold nothing else: it lies in a file's mapping (a
    topology the ranks of a machine share, ntp.engine.graph.node_shared), or it is :data:`_OWN_MAPPING_BYTES` or more."""
    if not t.numel():
        return False
    return t.untyped_storage().nbytes() >= _OWN_MAPPING_BYTES or _mapped_file(*_pages(t)) is not None


def _pages(t: torch.Tensor) -> tuple[int, int]:
    """The first and the end address of the whole pages that ``t``'s storage touches (a view's too)."""
    storage = t.untyped_storage()
    start = storage.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    end = -(-(storage.data_ptr() + storage.nbytes()) // mmap.PAGESIZE) * mmap.PAGESIZE
    return start, end


def _mapped_file(start: int, end: int) -> str | None:
    """The file whose mapping holds the addresses ``[start, end)`` in this process (``/proc/self/maps``), or None
    (anonymous memory, the heap, or not one mapping)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(a, 16) for a in fields[0].split("-"))
            if lo <= start < hi:
                path = fields[5].strip() if len(fields) == 6 else ""
                return path if end <= hi and path.startswith("/") else None
    return None


def _driver():
    """The CUDA driver library (None without a GPU)."""
    global _driver_lib
    if _driver_lib is None:
        try:
            _driver_lib = ctypes.CDLL("libcuda.so.1") if torch.cuda.is_available() else False
        except OSError:
            _driver_lib = False
    return _driver_lib or None
