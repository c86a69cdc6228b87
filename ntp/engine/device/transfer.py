"""Copies between host and device memory for the offload modes: pinned host buffers, so copies run at the bus's
speed and overlap with compute, and side streams that carry them while the compute stream works. On a CPU rank
every helper reduces to an ordinary copy (host and device are the same memory)."""

from __future__ import annotations

import collections
import contextlib
from typing import Callable

import torch

from ntp.engine.kernels.cuda_transpose import transpose_copy


def streams_topology(offload: str, device_type: str) -> bool:
    """Whether products copy their chunks' topology to the device as they run (``--offload`` on a GPU; on a CPU
    the topology is where the products read it)."""
    return offload != "none" and device_type == "cuda"


def host_empty(*size: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """An uninitialised host tensor; ``pinned``: page-locked, so copies to and from a GPU run at the bus's speed and
    can overlap with compute."""
    return torch.empty(*size, dtype=dtype, pin_memory=pinned)


def moved(t: torch.Tensor, device: torch.device, columns: bool = False) -> torch.Tensor:
    """``t`` on ``device``, differentiable; whatever lands in host memory from a GPU, forward or backward, lands in
    pinned memory, so the copy back for the next product runs at the bus's speed (a gradient left to autograd's own
    copy lands in pageable memory: 0.5 s of a 1.8 s products-scale epoch under ``--offload all`` on an H200).
    ``columns``: it lands there laid out column by column (:func:`host_columns`), for products that take it a block
    of columns at a time. A column-major host tensor reaches a device row by row (:func:`device_rows`)."""
    if t.device == device:
        return t
    return _Moved.apply(t, device, columns)


class _Moved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, device: torch.device, columns: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.source, ctx.columns = t.device, columns
        return _copied(t, device, columns)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _copied(grad, ctx.source, ctx.columns), None, None


def _copied(t: torch.Tensor, device: torch.device, columns: bool) -> torch.Tensor:
    if t.is_cuda and device.type == "cpu":
        return host_columns(t, pinned=True) if columns else host_empty(*t.shape, dtype=t.dtype, pinned=True).copy_(t)
    if device.type == "cuda" and not t.is_cuda and t.dim() == 2 and is_column_major(t) and not t.is_contiguous():
        return device_rows(t, device)
    return t.to(device)


#: bytes of the columns that pass between a column-major host tensor and a device at once: the device holds one
#: such slab, transposed, besides the rows it lays them out in
SLAB_BYTES = 16 << 20


def slab_columns(rows: int, element_size: int) -> int:
    """Columns of one slab of a ``rows``-row matrix (at least one)."""
    return max(1, SLAB_BYTES // max(1, rows * element_size))


def _slabs(t: torch.Tensor, c0: int, c1: int) -> list[tuple[int, int]]:
    step = slab_columns(t.shape[0], t.element_size())
    return [(a, min(a + step, c1)) for a in range(c0, c1, step)]


def is_column_major(t: torch.Tensor) -> bool:
    """Whether the 2-D ``t`` lies column by column (its transpose is contiguous): any block of its columns is then
    one contiguous region of memory."""
    return t.t().is_contiguous()


def host_columns(t: torch.Tensor, pinned: bool) -> torch.Tensor:
    """The 2-D ``t`` in host memory (``pinned``: page-locked) laid out column by column. A block of its columns then
    reaches a device in one contiguous copy and returns in one: a block of a row-major host tensor is strided, and
    gathering and scattering such blocks on the host took most of a 0.45 s products-scale ``--offload all`` epoch
    on an H200. From a GPU, each slab of columns is transposed there and copied down in one piece."""
    out = host_empty(t.shape[1], t.shape[0], dtype=t.dtype, pinned=pinned).t()
    with Downloads(t.device) as downloads:
        downloads.copy_columns(out, t)
    return out


def device_rows(t: torch.Tensor, device: torch.device, c0: int = 0, c1: int | None = None) -> torch.Tensor:
    """Columns ``c0:c1`` of the column-major host tensor ``t`` on ``device``, laid out row by row (a slab at a time:
    :func:`_rows_from_columns`)."""
    c1 = t.shape[1] if c1 is None else c1
    out = torch.empty(t.shape[0], c1 - c0, dtype=t.dtype, device=device)
    _rows_from_columns(out, t, c0)
    return out


def _rows_from_columns(dst: torch.Tensor, src: torch.Tensor, c0: int) -> None:
    """``dst`` (on the device, row by row) gets columns ``c0:`` of the column-major host ``src``, a slab at a time,
    each copied as it lies (asynchronously from pinned memory) and transposed there, on the current stream (one
    slab's memory, reused in its order)."""
    for a, b in _slabs(src, c0, c0 + dst.shape[1]):
        transpose_copy(dst[:, a - c0 : b - c0], src[:, a:b].t().to(dst.device, non_blocking=True).t())


def _columns_from_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """The column-major host ``dst`` gets ``src`` (on the device, row by row), a slab of columns at a time, each
    transposed there into column order and copied down in one piece, on the current stream (one slab's memory)."""
    for a, b in _slabs(src, 0, src.shape[1]):
        slab = torch.empty(b - a, src.shape[0], dtype=src.dtype, device=src.device)
        transpose_copy(slab, src[:, a:b].t())
        dst[:, a:b].t().copy_(slab, non_blocking=True)


def layout_empty(
    rows: int, cols: int, dtype: torch.dtype, device: torch.device, compute: torch.device, columns: bool = True
) -> torch.Tensor:
    """An uninitialised ``rows x cols`` tensor on ``device`` for a rank that computes on ``compute``: in a GPU rank's
    host memory pinned, and laid out column by column where ``columns`` (:func:`host_columns`: a column slice, as
    products take it); elsewhere row by row."""
    if device.type != "cpu" or compute.type != "cuda":
        return torch.empty(rows, cols, dtype=dtype, device=device)
    if columns:
        return host_empty(cols, rows, dtype=dtype, pinned=True).t()
    return host_empty(rows, cols, dtype=dtype, pinned=True)


def _across_columns(t: torch.Tensor, device: torch.device) -> bool:
    """Whether rows of ``t`` cross to ``device`` from a column-major host layout (:func:`is_column_major`), whose
    rows are strided: they then travel as its columns' runs, transposed on the device."""
    return t.device != device and t.dim() == 2 and not t.is_contiguous() and is_column_major(t)


def rows_on(t: torch.Tensor, a: int, b: int, device: torch.device) -> torch.Tensor:
    """Rows ``a:b`` of ``t`` on ``device`` (a view where ``t`` is there already). From a column-major host ``t``, each
    column's run of rows is gathered on the host into pinned memory, copied up asynchronously and laid out as rows
    there: torch's own copy of such a strided view stages it in pageable memory and waits for it."""
    if _across_columns(t, device):
        staged = host_empty(t.shape[1], b - a, dtype=t.dtype, pinned=True).copy_(t.t()[:, a:b])
        return staged.to(device, non_blocking=True).t().contiguous()  # torch keeps staged until the copy has read it
    return t[a:b].to(device)


def put_rows(dst: torch.Tensor, a: int, src: torch.Tensor) -> None:
    """``dst[a:a + len(src)] = src``, from any device; into a column-major host ``dst`` transposed on ``src``'s device,
    copied down into pinned memory and spread into its columns' runs on the host (:meth:`Downloads.put_rows` does it
    without waiting for the copy)."""
    if _across_columns(dst, src.device):
        staged = host_empty(src.shape[1], src.shape[0], dtype=src.dtype, pinned=src.is_cuda).copy_(src.t())
        dst.t()[:, a : a + src.shape[0]].copy_(staged)
    else:
        dst[a : a + src.shape[0]].copy_(src)


def even_blocks(width: int, block: int) -> list[tuple[int, int]]:
    """``width`` columns in as few blocks of at most ``block`` columns as hold them, of widths that differ by one at
    most (a narrow last block would pass over the whole topology for a few columns)."""
    count = -(-width // max(1, block)) if width else 0
    return [(width * i // count, width * (i + 1) // count) for i in range(count)]


def stream_depth(topology_streams: bool) -> int:
    """The sets of buffers :func:`stream_columns` takes: 2, so that the next block arrives while one computes, unless
    the products stream their topology, which fills the bus already (1)."""
    return 1 if topology_streams else 2


def stream_columns(
    h: torch.Tensor,
    out: torch.Tensor,
    device: torch.device,
    blocks: list[tuple[int, int]],
    depth: int,
    compute: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """For each block ``(c0, c1)`` of columns, in order, ``compute(x, y)`` on ``device``, both laid out row by row:
    ``x`` holds the block of the column-major host tensor ``h``; what ``compute`` writes into ``y`` lands in the block
    of ``out`` (column-major, host) before this returns. On a GPU, blocks arrive on one side stream and leave on
    another, a slab of columns at a time, transposed there; ``depth`` 2: in two sets of buffers, so the next block
    arrives and the previous one leaves while the compute stream works on this one; 1: one set, the next block
    arriving as the previous one leaves. Buffers are allocated once: the device holds ``2 * depth`` blocks and a slab
    each way (ntp.engine.memory.parts.streamed_bytes). On a CPU every copy happens where it is issued."""
    rows, widest = h.shape[0], max((c1 - c0 for c0, c1 in blocks), default=0)
    depth = min(depth, len(blocks))  # one block: one set
    xs, ys = ([torch.empty(rows * widest, dtype=h.dtype, device=device) for _ in range(depth)] for _ in range(2))
    up, down, main = _stream(device), _stream(device), _current_stream(device)
    computed: list = [None] * depth  # per set: the compute stream is done with it
    left: list = [None] * depth  # per set: its output has left
    arrived: dict[int, object] = {}

    def upload(k: int) -> None:
        _wait(up, computed[k % depth])
        with _on(up):
            _rows_from_columns(_view(xs[k % depth], rows, blocks[k]), h, blocks[k][0])
        arrived[k] = _mark(up)

    _wait(up, _mark(main))  # the buffers may reuse memory that work queued on the compute stream still reads
    try:
        if blocks:
            upload(0)
        for k, (c0, c1) in enumerate(blocks):
            if depth > 1 and k + 1 < len(blocks):
                upload(k + 1)
            _wait(main, arrived.pop(k))
            _wait(main, left[k % depth])
            y = _view(ys[k % depth], rows, (c0, c1))
            compute(_view(xs[k % depth], rows, (c0, c1)), y)
            computed[k % depth] = _mark(main)
            _wait(down, computed[k % depth])
            with _on(down):
                _columns_from_rows(out[:, c0:c1], y)
            left[k % depth] = _mark(down)
            if depth == 1 and k + 1 < len(blocks):
                upload(k + 1)
    finally:  # the buffers are freed next (also after an error): no stream may still use them
        for stream in (up, down):
            if stream is not None:
                stream.synchronize()


def _view(buffer: torch.Tensor, rows: int, block: tuple[int, int]) -> torch.Tensor:
    return buffer[: rows * (block[1] - block[0])].view(rows, block[1] - block[0])


# -- CUDA streams and events, or nothing on a CPU (work there is done when issued) ---------------------------------
def _stream(device: torch.device):
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _current_stream(device: torch.device):
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _mark(stream):
    """An event recorded on ``stream`` now (None on a CPU)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _wait(stream, event) -> None:
    """``stream`` waits for ``event`` (where both exist)."""
    if stream is not None and event is not None:
        stream.wait_event(event)


#: :meth:`Downloads.put_rows` copies on their way before the host waits for the oldest (each a block's pinned buffer)
PENDING_PUTS = 2


class Downloads:
    """Device-to-host copies on a side stream, each issued after everything the compute stream has queued, so a
    chunk's output travels while the next chunk computes; leaving the ``with`` block waits for all of them. On the
    CPU a copy is an ordinary copy."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: collections.deque = collections.deque()  #: :meth:`put_rows` copies not yet spread on the host
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

    def copy_columns(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``src`` into ``dst`` of its shape, laid out column by column in host memory: a slab of columns at a time,
        on a GPU transposed on the side stream (one slab's memory, reused in stream order), then copied in one
        piece."""
        if not self.cuda:
            dst.copy_(src)
            return
        self.stream.wait_stream(self.compute)
        with torch.cuda.stream(self.stream):
            _columns_from_rows(dst, src)
        src.record_stream(self.stream)

    def put_rows(self, dst: torch.Tensor, a: int, src: torch.Tensor) -> None:
        """:func:`put_rows` without waiting: into a column-major host ``dst``, ``src`` is transposed and copied into
        pinned memory on the side stream, and spread into ``dst``'s columns on the host once it has arrived (after
        :data:`PENDING_PUTS` more, or on leaving the ``with`` block), so the compute stream never waits for it."""
        if not (self.cuda and _across_columns(dst, src.device)):
            put_rows(dst, a, src)
            return
        self.stream.wait_stream(self.compute)
        with torch.cuda.stream(self.stream):
            staged = host_empty(src.shape[1], src.shape[0], dtype=src.dtype, pinned=True)
            staged.copy_(src.t(), non_blocking=True)  # transposed on the side stream, then one copy
            arrived = _mark(self.stream)
        src.record_stream(self.stream)
        self.pending.append((arrived, staged, dst, a))
        while len(self.pending) > PENDING_PUTS:
            self._spread(*self.pending.popleft())

    @staticmethod
    def _spread(arrived, staged: torch.Tensor, dst: torch.Tensor, a: int) -> None:  # noqa: ANN001 (an event)
        if arrived is not None:
            arrived.synchronize()
        dst.t()[:, a : a + staged.shape[1]].copy_(staged)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.stream.synchronize()  # the host reads the output next
        while self.pending:
            self._spread(*self.pending.popleft())


class Staging:
    """Pinned host buffers, one per tensor it stages, each ``numels[i]`` elements of ``dtypes[i]``: what is copied
    to the device passes through them so the copy is asynchronous. :meth:`fill` reuses them only after the copy
    recorded on ``copied`` has left them."""

    def __init__(self, numels: list[int], dtypes: list[torch.dtype], allocate: bool = True) -> None:
        """``allocate``: False gives no buffers, only the event (the tensors copied are pinned already)."""
        self.buffers = [host_empty(n, dtype=dt, pinned=True) for n, dt in zip(numels, dtypes)] if allocate else []
        self.copied = torch.cuda.Event()

    def fill(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``tensors`` copied into the buffers (views of their shapes), once the previous copy out has finished."""
        self.copied.synchronize()
        return tuple(b[: t.numel()].view(t.shape).copy_(t) for b, t in zip(self.buffers, tensors))


def streamed(parts: list[tuple[torch.Tensor, ...]], device: torch.device, pinned: bool = False):
    """Each part's tensors on ``device``, in order, copied on a side stream one part ahead of the compute. From
    where they lie when ``pinned`` (their host memory is page-locked: ntp.engine.device.page_lock), else through two
    pinned staging buffers allocated once (double buffering). Its loop is tested with no-op streams."""
    if not parts:
        return
    copy_stream = torch.cuda.Stream(device)
    compute_stream = torch.cuda.current_stream(device)
    sizes = [max(p[i].numel() for p in parts) for i in range(len(parts[0]))]
    slots = [Staging(sizes, [t.dtype for t in parts[0]], allocate=not pinned) for _ in range(2)]

    def prefetch(j: int):
        slot = slots[j % 2]
        host = parts[j] if pinned else slot.fill(*parts[j])  # fill waits until the slot's last copy has left it
        copy_stream.wait_stream(compute_stream)  # never overwrite device memory the compute stream still reads
        with torch.cuda.stream(copy_stream):
            tensors = tuple(t.to(device, non_blocking=True) for t in host)
            slot.copied.record(copy_stream)
        return tensors, slot.copied

    pending = prefetch(0)
    for j in range(len(parts)):
        tensors, done = pending
        compute_stream.wait_event(done)
        for t in tensors:
            t.record_stream(compute_stream)  # allocated on the copy stream, used on the compute stream
        pending = prefetch(j + 1) if j + 1 < len(parts) else None
        yield tensors
