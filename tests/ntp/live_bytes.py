"""Live tensor bytes of a piece of work, counted exactly: every dense storage an operator creates (not a view of
an input) is added when it appears and subtracted when it is freed (what a GPU's caching allocator would hold, less
its rounding), so the memory plan's estimates can be checked on a CPU."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: how far above a step's measured bytes the memory plan may be (issue 47: within 10 %, and never below)
PLAN_SLACK = 1.1
#: how far above a link step its plan may be: its parts are bounds that do not all peak together (the pair chunk and
#: the encoder's working copies never live at once); measured on a CPU 1.05-1.34x (bfloat16 the most; 2026-12-02),
#: not yet within PLAN_SLACK as a node step's plan is
LINK_SLACK = 1.4
#: how far above what a streamed step holds on its device its plan may be (ntp.engine.memory.phases.peak_bytes):
#: measured on two CPU ranks 1.02-1.27x, the same bytes every run since gloo's buffers are released in the caller
#: (2026-12-02; a CPU chunk whose product scales its rows once counts a byte an edge, not 8; 1.17-1.45x before; the
#: classic options' widths and APPNP's restart are bounds), not yet within PLAN_SLACK
STREAM_SLACK = 1.3


class LiveBytes(TorchDispatchMode):
    """``live``: bytes of the storages created inside the mode and still alive; ``peak``: their maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out, {_storage_address(m) for t in tree_flatten((args, kwargs))[0] for m in _members(t)})
        return out

    def _record(self, out, inputs: set[int]) -> None:  # noqa: ANN001 (an operator's outputs)
        for t in tree_flatten(out)[0]:
            if _dense(t) and _storage_address(t) not in inputs:  # a view of an input (maybe made before) is not new
                self._count(t.untyped_storage())

    def _count(self, storage: torch.UntypedStorage) -> None:
        key, size = id(storage), storage.nbytes()
        if size and key not in self._seen:  # a view or an in-place result shares a storage already counted
            self._seen.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size


class DeviceBytes(LiveBytes):
    """:class:`LiveBytes` of what a GPU rank would hold on its device: every storage but those made for host memory
    (ntp.engine.device.transfer.host_empty: a streamed stage's rows and what its backward keeps), which a CPU rank
    makes in the same memory, and what operators make of such tensors alone. A GPU's copies of a block on its way
    up are views on a CPU, not counted."""

    def __enter__(self) -> "DeviceBytes":
        import ntp.engine.device.transfer as transfer
        import ntp.engine.parallel.row_stream as row_stream

        original, self._hosting, self._host = transfer.host_empty, False, set()

        def host_empty(*size: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
            self._hosting = True
            try:
                return original(*size, dtype=dtype, pinned=pinned)
            finally:
                self._hosting = False

        self._restore = [(module, original) for module in (transfer, row_stream)]
        for module, _ in self._restore:
            module.host_empty = host_empty
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        for module, original in self._restore:
            module.host_empty = original
        return super().__exit__(*exc)

    def _record(self, out, inputs: set[int]) -> None:  # noqa: ANN001 (an operator's outputs)
        # an operator on host tensors alone runs on a GPU rank's host too (autograd summing two rows' gradients)
        self._hosting, was = self._hosting or bool(inputs) and inputs <= self._host, self._hosting
        try:
            super()._record(out, inputs)
        finally:
            self._hosting = was

    def _count(self, storage: torch.UntypedStorage) -> None:
        if not self._hosting:
            super()._count(storage)
        elif storage.nbytes() and storage.data_ptr() not in self._host:
            self._host.add(storage.data_ptr())
            weakref.finalize(storage, self._host.discard, storage.data_ptr())


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided


def _members(t) -> list[torch.Tensor]:
    """The dense tensors ``t`` holds: itself, or a sparse tensor's index and value tensors (what its accessors return
    views of; a CSR made of the topology's columns does not make them new)."""
    if not isinstance(t, torch.Tensor):
        return []
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    return [t] if t.layout == torch.strided else []


def _storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def gpu_step_peak(job, epoch: int = 1) -> int:  # noqa: ANN001 (a ntp.engine.train.setup.Job)
    """The GPU's allocation peak over a training step, above what lived before it. A step's phases
    (ntp.engine.device.measure.PhaseMemory: "nn", "propagate") reset the device's peak counter as they switch, so the
    allocator's peak read after the step is its last phase's alone: the step's is the largest of its phases'."""
    from ntp.engine.train.loop import train_step

    torch.cuda.synchronize()
    job.ctx.reset_stats()  # the phases' peaks, and the device's counter
    before = torch.cuda.memory_allocated()
    train_step(job, epoch)
    torch.cuda.synchronize()
    return max(job.ctx.memory.snapshot().values()) - before


def held_bytes(job) -> int:  # noqa: ANN001 (a ntp.engine.train.setup.Job)
    """Bytes a job holds between steps that the memory plan counts besides the topology: its features, its
    parameters and the optimiser's state (Adam's moments; a step's gradients are made in the step, where they are
    counted live)."""
    state = [t for s in job.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    tensors = [job.x, *job.model.parameters(), *state]
    return sum(t.numel() * t.element_size() for t in tensors)


def chunk_bytes(job, width: int | None = None, element_bytes: int = 4, device_type: str | None = None) -> int:  # noqa: ANN001
    """The working set of propagation's one chunk as the plan counts it for a ``device_type`` device
    (ntp.engine.memory.chunks.one_chunk_bytes: its edges, and output rows ``width`` wide, the slice's by default,
    where it makes its own; and a chunk's own bytes, CHUNK_BYTES), every row's cost: what a plan without a budget
    makes."""
    from ntp.engine.memory.chunks import CHUNK_BYTES, degree_costs, one_chunk_bytes

    topo = job.ctx.topology
    width = job.ctx.slice_width if width is None else width
    degrees = topo.in_degrees().numpy(), topo.out_degrees().numpy()
    costs = degree_costs(*degrees, width, element_bytes=element_bytes, device_type=device_type)
    return one_chunk_bytes(costs, width, element_bytes, device_type, pipelined=False) + CHUNK_BYTES
