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
    """``t`` on ``device`` (differentiable); from a GPU into host memory it lands in pinned memory, so the copy back
    for the next product runs at the bus's speed."""
    if not (t.is_cuda and device.type == "cpu"):
        return t.to(device)
    return host_empty(*t.shape, dtype=t.dtype, pinned=True).copy_(t)


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
    """One pinned host buffer pair, sized for the largest chunk: row pointers and columns. Allocated once per loop;
    :meth:`fill` reuses it only after its previous copy has finished."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.crow = torch.empty(max(p[0].numel() for p in parts), dtype=parts[0][0].dtype).pin_memory()
        self.cols = torch.empty(max(p[1].numel() for p in parts), dtype=parts[0][1].dtype).pin_memory()
        self.copied = torch.cuda.Event()

    def fill(self, part: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        self.copied.synchronize()
        crow, cols = part
        return self.crow[: crow.numel()].copy_(crow), self.cols[: cols.numel()].copy_(cols)


class Uploads:
    """Column blocks of a host tensor copied to the device. The whole tensor goes in one copy (pinned: asynchronous).
    A narrower block is first gathered on the host into one of two pinned buffers, so its copy is asynchronous too
    and the host gathers the next block while the device computes; a buffer is refilled only once its copy has left
    it. Without ``pinned`` (a CPU rank) a block is an ordinary copy."""

    def __init__(self, h: torch.Tensor, step: int, device: torch.device, pinned: bool) -> None:
        self.h, self.device = h, device
        staged = pinned and step < h.shape[1]
        self.slots = [host_empty(h.shape[0] * step, dtype=h.dtype, pinned=True) for _ in range(2)] if staged else []
        self.copied = [torch.cuda.Event() for _ in self.slots]
        self.count = 0

    def block(self, c0: int, c1: int) -> torch.Tensor:
        src = self.h[:, c0:c1]
        if not self.slots:
            return src.contiguous().to(self.device, non_blocking=True)
        k, self.count = self.count % 2, self.count + 1
        self.copied[k].synchronize()
        staged = self.slots[k][: src.numel()].view(src.shape).copy_(src)
        x = staged.to(self.device, non_blocking=True)
        self.copied[k].record(torch.cuda.current_stream(self.device))
        return x
