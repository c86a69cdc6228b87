"""The NN stage in row blocks (``--nn-device stream``): the row layout lives in host memory and visits the rank's
device a block of rows at a time.

A *segment* is a function of whole rows (Linear layers, activations, dropout, layer norm, a GNN layer's bias and
root terms): :func:`stream_rows` runs it over blocks of rows on the device. Each block's inputs are copied up on a
side stream one block ahead of the compute, and its outputs go down on another into pinned host memory. The forward
keeps nothing on the device. The backward recomputes each block from its inputs (dropout masks are counter-based,
so they are drawn again, not kept: ntp.engine.kernels.masks), streams the inputs' gradients back and sums the parameters'
gradients on the device. The device then holds one block's activations, however many rows there are: the block's
size comes from the memory plan (ntp.engine.memory.parts.stream_block_rows).

A segment next to propagation exchanges its rows with the graph layout in its own passes (:class:`Exchange`):
its first input arrives gathered a block at a time, and its last output leaves split a block at a time, so those
rows, and their gradients in the backward, no longer go down to host memory and up again on either side of a
propagation (a copy of the gathered rows goes down once, for the backward's recompute).

A segment whose one output is a value a row of which only the sum is read (training's loss: a model's *tail*) is
*summed*: it returns the sum, and takes its gradients in the forward, block by block, as it would in the backward's
recompute. Its backward then only returns them: its inputs are neither kept for it nor copied up again (the logits'
rows of a 2-layer GCN at products scale: 188 bytes a vertex each way).

Input features that fit beside the rest stay on the device (ntp.engine.memory.placement.features_stay): their blocks
are views there, and neither the forward nor the backward's recompute copies them up.

On a CPU rank the same loop runs over views of the rows (no copies): what the tests compare with the in-memory stage.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch

from ntp.engine.device.precision import autocast
from ntp.engine.device.transfer import Downloads, host_empty, streamed
from ntp.engine.distributed.collectives import Comm

#: ``fn(position, *row_blocks)``: one tensor of the block's rows, or a tuple of them
Segment = Callable[..., "torch.Tensor | tuple[torch.Tensor, ...]"]

#: ``tail(position, output_rows)``: a row-wise function of a model's float32 output rows (a loss per row), the rows
#: from ``position.row_offset`` on
Tail = Callable[..., torch.Tensor]


def with_tail(segment: Segment, tail: Tail | None) -> Segment:
    """``segment`` followed by ``tail`` on its float32 output, as one segment (``segment`` itself without a tail)."""
    if tail is None:
        return segment
    return lambda position, *rows: tail(position, segment(position, *rows).float())


class Graphed(NamedTuple):
    """A matrix in the graph layout (tensor parallel: all rows, this rank's column slice), with the width of its
    rows, which gathering it back needs."""

    cols: torch.Tensor
    width: int


class Exchange(NamedTuple):
    """The graph side of a streamed segment whose passes run its split and gather
    (ntp.engine.distributed.collectives.Comm.split_pass): ``home``, where the graph layout lives; ``gathered``,
    the width of the first input, which arrives in the graph layout (0: none does); ``splits``, whether the last
    output leaves in it."""

    comm: Comm
    home: torch.device
    gathered: int
    splits: bool


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
    ctx,  # noqa: ANN001 (a GraphContext)
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    *,
    device: torch.device,
    block_rows: int,
    precision: str = "fp32",
    exchange: Exchange | None = None,
    summed: bool = False,
):
    """``fn(ctx, *inputs)`` computed a block of ``block_rows`` rows at a time on ``device``, the inputs and outputs in
    host memory; ``params``: the tensors ``fn`` reads besides its inputs that want gradients (on ``device``). Returns
    what ``fn`` returns, differentiable with respect to ``inputs`` and ``params``. With ``exchange``, the first input
    is in the graph layout (``exchange.gathered``) and reaches ``fn`` in rows, and the last output is returned in it
    as a :class:`Graphed` (``exchange.splits``), each a pass of rows at a time. ``summed``: ``fn`` returns one
    column whose sum over the rows is returned, its gradients taken in the forward (never with ``exchange.splits``)."""
    keeps = torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, *params))  # a backward follows
    runner = _Runner(fn, ctx, device, block_rows, precision, len(inputs), exchange, keeps, summed)
    outs = _Streamed.apply(runner, *inputs, *params)
    if summed:
        return outs
    if runner.splits:
        outs = (*outs[:-1], Graphed(outs[-1], runner.split_width))
    return outs if runner.returns_tuple else outs[0]


class _Runner:
    """One segment's forward and backward over blocks (what :class:`_Streamed` calls)."""

    def __init__(
        self,
        fn: Segment,
        ctx,  # noqa: ANN001
        device: torch.device,
        block_rows: int,
        precision: str,
        n_inputs: int,
        exchange: Exchange | None,
        keeps: bool,
        summed: bool = False,
    ) -> None:
        self.fn, self.ctx, self.device, self.precision, self.n_inputs = fn, ctx, device, precision, n_inputs
        self.block_rows = max(1, block_rows)
        self.exchange = exchange
        self.gathered = exchange.gathered if exchange else 0
        self.splits = bool(exchange and exchange.splits)
        self.returns_tuple = False
        self.split_width = 0  #: the columns of the rows that leave in the graph layout
        self.kept: torch.Tensor | None = None  #: the gathered input's rows, for the backward (host memory)
        self.keeps = keeps  #: whether a backward follows (not in evaluation), so the gathered rows are kept
        self.summed = summed  #: the one output's sum is returned, its gradients taken in the forward
        self.found: tuple[list, list] | None = None  #: those gradients (inputs', parameters'), until the backward

    def spans(self, rows: int) -> list[tuple[int, int]]:
        """The blocks: with an exchange, its passes (the same on every rank; the last may hold none of this rank's
        rows); else blocks of this rank's ``rows``."""
        if self.exchange:
            return self.exchange.comm.passes(self.block_rows)
        return [(a, min(a + self.block_rows, rows)) for a in range(0, rows, self.block_rows)]

    def call(self, first: int, blocks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with autocast(self.precision, self.device):
            out = self.fn(BlockPosition(self.ctx, first), *blocks)
        self.returns_tuple = isinstance(out, tuple)
        return out if isinstance(out, tuple) else (out,)

    def rows(self, row_inputs: Sequence[torch.Tensor]) -> int:
        """This rank's rows: its part's, with an exchange; else those of the inputs in rows."""
        return self.exchange.comm.part.num_rows() if self.exchange else row_inputs[0].shape[0]

    def saved(self, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """The inputs the backward reads again: all but a gathered one, whose rows it keeps itself (:attr:`kept`)."""
        return inputs[1:] if self.gathered else inputs

    def forward_summed(
        self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], wants: Sequence[bool]
    ) -> torch.Tensor:
        """The sum of the segment's one output over the rows; where a backward follows, the gradients of that sum
        with respect to the inputs and parameters that want them (``wants``) are taken as each block computes,
        and kept in :attr:`found` (a gathered input's leaves in the graph layout, a pass at a time)."""
        ex, n = self.exchange, len(inputs)
        host_in = self.saved(inputs)
        rows = self.rows(host_in)
        wants = list(wants) if self.keeps else [False] * (n + len(params))
        grad_in, graph_grad_in, grad_param = self.grad_buffers(inputs, params, wants, rows)
        total = torch.zeros((), device=self.device)
        summed = lambda ys: [(ys[0].sum(), None)]  # noqa: E731 (the one output's sum, its gradient 1)
        with Downloads(self.device) as downloads:
            for (a, b), blocks in self.uploads(host_in, rows):
                here = max(0, min(b, rows) - a)
                if self.gathered:
                    blocks = (ex.comm.gather_pass(inputs[0], a, b, self.gathered), *blocks)
                found = None
                if here:
                    if self.keeps:
                        ys, found = self._block_grads(a, blocks, summed, wants[:n], params, wants[n:])
                    else:
                        ys = self.call(a, blocks)
                    total += ys[0].detach().sum()
                self.put_grads(found, blocks, (a, b, here), grad_in, graph_grad_in, grad_param, wants[:n], downloads)
        if graph_grad_in is not None:
            grad_in[0] = graph_grad_in
        self.found = (grad_in, grad_param) if self.keeps else None
        return total

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        ex = self.exchange
        host_in = self.saved(inputs)
        rows = self.rows(host_in)
        if self.gathered and self.keeps:
            self.kept = host_empty(rows, self.gathered, dtype=inputs[0].dtype, pinned=self.device.type == "cuda")
        outs: list[torch.Tensor] | None = None  # allocated at the first block, which gives their shapes
        graph_out = None
        with Downloads(self.device) as downloads:
            for (a, b), blocks in self.uploads(host_in, rows):
                here = max(0, min(b, rows) - a)
                if self.gathered:
                    block = ex.comm.gather_pass(inputs[0], a, b, self.gathered)
                    if self.kept is not None:
                        downloads.copy(self.kept[a : a + here], block)
                    blocks = (block, *blocks)
                ys = self.call(a, blocks) if here or outs is None else None  # a rank without rows: shapes still
                if outs is None:
                    outs = [self.host(rows, y) for y in (ys[:-1] if self.splits else ys)]
                    if self.splits:
                        self.split_width = ys[-1].shape[1]
                        graph_out = ex.comm.slice_empty(self.split_width, ys[-1].dtype, ex.home)
                if here:
                    for out, y in zip(outs, ys):
                        downloads.copy(out[a:b], y)
                if self.splits:
                    leaving = ys[-1] if ys is not None else graph_out.new_zeros(0, self.split_width, device=self.device)
                    ex.comm.split_pass(leaving, a, b, graph_out, put=downloads.put_rows)
        return (*outs, graph_out) if self.splits else tuple(outs)

    def backward(
        self, saved: Sequence[torch.Tensor], params: Sequence[torch.Tensor], grads: Sequence, wants: Sequence[bool]
    ) -> tuple[list, list]:
        ex = self.exchange
        inputs = [self.kept, *saved] if self.gathered else list(saved)
        rows = self.rows(inputs)
        n = len(inputs)
        grad_in, graph_grad_in, grad_param = self.grad_buffers(inputs, params, wants, rows)
        graph_grad = grads[-1] if self.splits else None
        host_grads = grads[:-1] if self.splits else grads
        given = [i for i, g in enumerate(host_grads) if g is not None]
        with Downloads(self.device) as downloads:
            for (a, b), blocks in self.uploads([*inputs, *(host_grads[i] for i in given)], rows):
                here = max(0, min(b, rows) - a)
                arriving = ex.comm.gather_pass(graph_grad, a, b, self.split_width) if graph_grad is not None else None

                def pairs(ys, grads=blocks[n:], arriving=arriving):  # noqa: ANN001, ANN202
                    last = [(ys[-1], arriving)] if arriving is not None else []
                    return [(ys[i], g) for i, g in zip(given, grads)] + last

                found = self._block_grads(a, blocks, pairs, wants[:n], params, wants[n:])[1] if here else None
                self.put_grads(found, blocks, (a, b, here), grad_in, graph_grad_in, grad_param, wants[:n], downloads)
        if graph_grad_in is not None:
            grad_in[0] = graph_grad_in
        return grad_in, grad_param

    def grad_buffers(self, inputs, params, wants: Sequence[bool], rows: int) -> tuple:  # noqa: ANN001
        """Where the gradients of the inputs and parameters that want them (``wants``) are summed: host rows, but a
        gathered input's, which leaves in the graph layout, a pass at a time."""
        n, ex = len(inputs), self.exchange
        graph_grad_in = None
        if self.gathered and wants[0]:
            graph_grad_in = ex.comm.slice_empty(self.gathered, inputs[0].dtype, ex.home)
        grad_in = [
            self.host(rows, x) if w and not (i == 0 and self.gathered) else None
            for i, (x, w) in enumerate(zip(inputs, wants[:n]))
        ]
        return grad_in, graph_grad_in, [torch.zeros_like(p) if w else None for p, w in zip(params, wants[n:])]

    def put_grads(  # noqa: ANN001
        self, found, blocks, span, grad_in, graph_grad_in, grad_param, wants_in, downloads
    ) -> None:
        """One block's gradients (``found``: :meth:`_block_grads`'; None on a rank without rows in the pass) into
        their buffers (:meth:`grad_buffers`): the inputs' copied down, a gathered input's split into the graph layout
        (a collective: every rank takes part in every pass), the parameters' summed on the device."""
        a, b, here = span
        leaving = None
        for k, (out, w) in enumerate(zip(grad_in, wants_in)):
            if not w:
                continue
            g = found[k] if found is not None else None
            g = torch.zeros_like(blocks[k]) if g is None else g  # None: the segment ignores this input
            if out is None:  # the gathered input's
                leaving = g
            elif here:
                downloads.copy(out[a:b], g)
        if graph_grad_in is not None:
            self.exchange.comm.split_pass(leaving, a, b, graph_grad_in, put=downloads.put_rows)
        if found is not None:
            for acc, g in zip(grad_param, found[len(wants_in) :]):
                if acc is not None and g is not None:
                    acc.add_(g)

    def _block_grads(self, a: int, blocks, pairs, wants_in, params, wants_param) -> tuple:  # noqa: ANN001
        """One block's outputs, computed with autograd on (in the backward, again), and the gradients of its inputs
        (one per input, None where not wanted or unused) then of the parameters (None where not wanted), or None where
        nothing flows. ``pairs(outputs)``: the (output, its gradient) pairs to differentiate, None for a scalar's 1."""
        n = len(wants_in)
        xs = [x.detach().requires_grad_(w) for x, w in zip(blocks[:n], wants_in)]
        with torch.enable_grad():
            ys = self.call(a, xs)
            outs = [(y, torch.ones_like(y) if g is None else g.to(y.dtype)) for y, g in pairs(ys) if y.requires_grad]
        wrt = [x for x, w in zip(xs, wants_in) if w] + [p for p, w in zip(params, wants_param) if w]
        if not outs or not wrt:
            return ys, None
        found = iter(torch.autograd.grad([y for y, _ in outs], wrt, [g for _, g in outs], allow_unused=True))
        return ys, [next(found) if w else None for w in wants_in] + [next(found) if w else None for w in wants_param]

    def host(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A host tensor for ``rows`` rows of ``like``'s shape, pinned where a GPU writes it."""
        return host_empty(rows, *like.shape[1:], dtype=like.dtype, pinned=self.device.type == "cuda")

    def uploads(self, tensors: Sequence[torch.Tensor], rows: int):
        """((first, end), the tensors' rows ``first:end`` on the device) for each of :meth:`spans`, in order (fewer
        rows where the rank's rows end first): on a GPU, those in host memory copied on a side stream one block
        ahead (ntp.engine.device.transfer.streamed), views of those on the device already (input features that stay
        there: ntp.engine.memory.placement.features_stay); on a CPU the views themselves."""
        spans = self.spans(rows)
        parts = [tuple(t[a : min(b, rows)] for t in tensors) for a, b in spans]
        hosted = [i for i, t in enumerate(tensors) if t.device != self.device]
        if self.device.type != "cuda" or not hosted:
            yield from zip(spans, parts)
            return
        pinned = all(tensors[i].is_pinned() for i in hosted)
        arriving = streamed([tuple(p[i] for i in hosted) for p in parts], self.device, pinned=pinned)
        for span, part, arrived in zip(spans, parts, arriving):
            blocks = list(part)
            for i, block in zip(hosted, arrived):
                blocks[i] = block
            yield span, tuple(blocks)


class _Streamed(torch.autograd.Function):
    """Autograd's view of a streamed segment: inputs in host memory (one in the graph layout, with an exchange),
    parameters on the device; nothing kept but the inputs' rows (host memory), which the backward streams through
    the device again."""

    @staticmethod
    def forward(ctx, runner: _Runner, *tensors: torch.Tensor):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # an output that nothing used has no gradient to stream
        inputs, params = tensors[: runner.n_inputs], tensors[runner.n_inputs :]
        ctx.runner = runner
        if runner.summed:  # the backward reads nothing but the gradients the forward took
            return runner.forward_summed(inputs, params, ctx.needs_input_grad[1:])
        ctx.save_for_backward(*runner.saved(inputs), *params)
        return runner.forward(inputs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        runner = ctx.runner
        if runner.summed:
            return (None, *_scaled(runner, grads[0], len(ctx.needs_input_grad) - 1))
        saved = ctx.saved_tensors
        n_saved = len(saved) - (len(ctx.needs_input_grad) - 1 - runner.n_inputs)
        inputs, params = saved[:n_saved], saved[n_saved:]
        if all(g is None for g in grads):
            return (None,) * len(ctx.needs_input_grad)
        grad_in, grad_param = runner.backward(inputs, params, grads, ctx.needs_input_grad[1:])
        return (None, *grad_in, *grad_param)


def _scaled(runner: _Runner, grad: torch.Tensor | None, count: int) -> list:
    """A summed segment's ``count`` gradients (:meth:`_Runner.forward_summed`) for ``grad``, the gradient of its sum:
    as taken where it is 1 (a loss's own backward), else scaled by it."""
    if grad is None or runner.found is None:
        return [None] * count
    found = [*runner.found[0], *runner.found[1]]
    runner.found = None  # the step's only backward: free them with it
    if bool(grad == 1):
        return found
    return [g * grad.to(g.device) if g is not None else None for g in found]
