"""Copies between host and device memory for the offload modes: pinned host buffers, so copies run at the bus's
speed and overlap with compute, and side streams that carry them while the compute stream works. On a CPU rank
every helper reduces to an ordinary copy (host and device are the same memory)."""
from __future__ import annotations

import torch


def host_empty(*size: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """An uninitialised host tensor; ``pinned``: page-locked, so copies to and from a GPU run at the bus's speed and
    can overlap with compute."""
    return torch.empty(*size, dtype=dtype, pin_memory=pinned)


def moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, differentiable; whatever lands in host memory from a GPU, forward or backward, lands in
    pinned memory, so the copy back for the next product runs at the bus's speed (a gradient left to autograd's own
    copy lands in pageable memory: 0.5 s of a 1.8 s products-scale epoch under ``--offload all`` on an H200)."""
    if t.device == device:
        return t
    return _Moved.apply(t, device)


class _Moved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, device: torch.device) -> torch.Tensor:  # type: ignore[override]
        ctx.source = t.device
        return _copied(t, device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _copied(grad, ctx.source), None


def _copied(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.is_cuda and device.type == "cpu":
        return host_empty(*t.shape, dtype=t.dtype, pinned=True).copy_(t)
    return t.to(device)


class Downloads:
    """Device-to-host copies on a side stream, each issued after everything the compute stream has queued, so a
    chunk's output travels while the next chunk computes; leaving the ``with`` block waits for all of them. On the
    CPU a copy is an ordinary copy."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.stream, self.compute = torch.cuda.Stream(device), torch.cuda.current_stream(device)

    def __enter__(self) -> "Downloads":
        return self

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if not self.cuda:
            dst.copy_(src)
            return
        self.stream.wait_stream(self.compute)
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(self.stream)  # the compute stream may free src before the copy has read it

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.stream.synchronize()  # the host reads the output next


class Staging:
    """Pinned host buffers, one per tensor it stages, each ``numels[i]`` elements of ``dtypes[i]``: what is copied
    to the device passes through them so the copy is asynchronous. :meth:`fill` reuses them only after the copy
    recorded on ``copied`` has left them."""

    def __init__(self, numels: list[int], dtypes: list[torch.dtype]) -> None:
        self.buffers = [host_empty(n, dtype=dt, pinned=True) for n, dt in zip(numels, dtypes)]
        self.copied = torch.cuda.Event()

    def fill(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``tensors`` copied into the buffers (views of their shapes), once the previous copy out has finished."""
        self.copied.synchronize()
        return tuple(b[: t.numel()].view(t.shape).copy_(t) for b, t in zip(self.buffers, tensors))


def uploaded_blocks(h: torch.Tensor, step: int, device: torch.device, pinned: bool):
    """``(c0, c1, block)`` for each ``step``-column block of the host tensor ``h``, copied to ``device``. The whole
    tensor goes in one copy (pinned: asynchronous). A narrower block is first gathered on the host into one of two
    pinned buffers, so its copy is asynchronous too and the host gathers the next block while the device computes;
    a buffer is refilled only once its copy has left it. Without ``pinned`` (a CPU rank) a block is an ordinary
    copy."""
    width = h.shape[1]
    slots = [Staging([h.shape[0] * step], [h.dtype]) for _ in range(2)] if pinned and step < width else []
    for k, c0 in enumerate(range(0, width, step)):
        c1 = min(c0 + step, width)
        src = h[:, c0:c1]
        if not slots:
            yield c0, c1, src.contiguous().to(device, non_blocking=True)
            continue
        slot = slots[k % 2]
        (staged,) = slot.fill(src)
        x = staged.to(device, non_blocking=True)
        slot.copied.record(torch.cuda.current_stream(device))
        yield c0, c1, x
