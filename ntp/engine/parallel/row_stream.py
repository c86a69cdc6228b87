"""The NN stage in row blocks (``--nn-device stream``): the row layout lives in host memory and visits the rank's
device a block of rows at a time.

A *segment* is a function of whole rows (Linear layers, activations, dropout, layer norm, a GNN layer's bias and
root terms): :func:`stream_rows` runs it over blocks of rows on the device. Each block's inputs are copied up on a
side stream one block ahead of the compute, and its outputs go down on another into pinned host memory. The forward
keeps nothing on the device. The backward recomputes each block from its inputs (dropout masks are counter-based,
so they are drawn again, not kept: ntp.engine.kernels.masks), streams the inputs' gradients back and sums the parameters'
gradients on the device. The device then holds one block's activations, however many rows there are: the block's
size comes from the memory plan (ntp.engine.memory.parts.stream_block_rows).

On a CPU rank the same loop runs over views of the rows (no copies): what the tests compare with the in-memory stage.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ntp.engine.device.precision import autocast
from ntp.engine.device.transfer import Downloads, host_empty, streamed

#: ``fn(position, *row_blocks)``: one tensor of the block's rows, or a tuple of them
Segment = Callable[..., "torch.Tensor | tuple[torch.Tensor, ...]"]


class BlockPosition:
    """The rank's context as a segment's block sees it: the same, but its first global row is the block's, so dropout
    draws the rows' own masks (ntp.engine.kernels.dropout.Position)."""

    def __init__(self, ctx, first: int) -> None:  # noqa: ANN001 (a GraphContext)
        self._ctx = ctx
        self.row_offset = ctx.row_offset + first

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)


def stream_rows(
    fn: Segment,
    ctx,
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    *,  # noqa: ANN001
    device: torch.device,
    block_rows: int,
    precision: str = "fp32",
):
    """``fn(ctx, *inputs)`` computed a block of ``block_rows`` rows at a time on ``device``, the inputs and outputs in
    host memory; ``params``: the tensors ``fn`` reads besides its inputs that want gradients (on ``device``). Returns
    what ``fn`` returns, differentiable with respect to ``inputs`` and ``params``."""
    runner = _Runner(fn, ctx, device, block_rows, precision, len(inputs))
    outs = _Streamed.apply(runner, *inputs, *params)
    return outs if runner.returns_tuple else outs[0]


class _Runner:
    """One segment's forward and backward over blocks (what :class:`_Streamed` calls)."""

    def __init__(
        self,
        fn: Segment,
        ctx,
        device: torch.device,
        block_rows: int,
        precision: str,  # noqa: ANN001
        n_inputs: int,
    ) -> None:
        self.fn, self.ctx, self.device, self.precision, self.n_inputs = fn, ctx, device, precision, n_inputs
        self.block_rows = max(1, block_rows)
        self.returns_tuple = False

    def blocks(self, rows: int) -> list[tuple[int, int]]:
        return [(a, min(a + self.block_rows, rows)) for a in range(0, rows, self.block_rows)]

    def call(self, first: int, blocks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with autocast(self.precision, self.device):
            out = self.fn(BlockPosition(self.ctx, first), *blocks)
        self.returns_tuple = isinstance(out, tuple)
        return out if isinstance(out, tuple) else (out,)

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        rows = inputs[0].shape[0]
        outs: list[torch.Tensor] = []
        with Downloads(self.device) as downloads:
            for (a, b), blocks in self.uploads(inputs, rows):
                ys = self.call(a, blocks)
                if not outs:
                    outs = [self.host(rows, y) for y in ys]
                for out, y in zip(outs, ys):
                    downloads.copy(out[a:b], y)
        return tuple(outs)

    def backward(
        self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], grads: Sequence, wants: Sequence[bool]
    ) -> tuple[list, list]:
        rows = inputs[0].shape[0]
        wants_in, wants_param = wants[: len(inputs)], wants[len(inputs) :]
        grad_in = [self.host(rows, x) if w else None for x, w in zip(inputs, wants_in)]
        grad_param = [torch.zeros_like(p) if w else None for p, w in zip(params, wants_param)]
        given = [i for i, g in enumerate(grads) if g is not None]
        with Downloads(self.device) as downloads:
            for (a, b), blocks in self.uploads([*inputs, *(grads[i] for i in given)], rows):
                xs = [x.detach().requires_grad_(w) for x, w in zip(blocks[: len(inputs)], wants_in)]
                with torch.enable_grad():
                    ys = self.call(a, xs)
                outs = [(ys[i], g) for i, g in zip(given, blocks[len(inputs) :]) if ys[i].requires_grad]
                wrt = [x for x, w in zip(xs, wants_in) if w] + [p for p, w in zip(params, wants_param) if w]
                if not outs or not wrt:
                    continue
                found = iter(
                    torch.autograd.grad([y for y, _ in outs], wrt, [g.to(y.dtype) for y, g in outs], allow_unused=True)
                )
                for out, x, w in zip(grad_in, xs, wants_in):
                    if w:
                        g = next(found)  # None: the segment ignores this input
                        downloads.copy(out[a:b], torch.zeros_like(x) if g is None else g)
                for acc, w in zip(grad_param, wants_param):
                    g = next(found) if w else None
                    if g is not None:
                        acc.add_(g)
        return grad_in, grad_param

    def host(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A host tensor for ``rows`` rows of ``like``'s shape, pinned where a GPU writes it."""
        return host_empty(rows, *like.shape[1:], dtype=like.dtype, pinned=self.device.type == "cuda")

    def uploads(self, tensors: Sequence[torch.Tensor], rows: int):
        """((first, end), the tensors' rows ``first:end`` on the device) for each block, in order: on a GPU copied on
        a side stream one block ahead (ntp.engine.device.transfer.streamed); on a CPU the views themselves."""
        spans = self.blocks(rows)
        parts = [tuple(t[a:b] for t in tensors) for a, b in spans]
        if self.device.type != "cuda":
            yield from zip(spans, parts)
            return
        pinned = all(t.is_pinned() for t in tensors)
        yield from zip(spans, streamed(parts, self.device, pinned=pinned))


class _Streamed(torch.autograd.Function):
    """Autograd's view of a streamed segment: inputs in host memory, parameters on the device; nothing kept but the
    inputs (host memory), which the backward streams through the device again."""

    @staticmethod
    def forward(ctx, runner: _Runner, *tensors: torch.Tensor):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # an output that nothing used has no gradient to stream
        inputs, params = tensors[: runner.n_inputs], tensors[runner.n_inputs :]
        ctx.runner = runner
        ctx.save_for_backward(*inputs, *params)
        return runner.forward(inputs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        runner = ctx.runner
        saved = ctx.saved_tensors
        inputs, params = saved[: runner.n_inputs], saved[runner.n_inputs :]
        if all(g is None for g in grads):
            return (None,) * (1 + len(saved))
        grad_in, grad_param = runner.backward(inputs, params, grads, ctx.needs_input_grad[1:])
        return (None, *grad_in, *grad_param)
