"""Host tensors a collective used are freed when their caller drops them, not when gloo's worker thread gets to it.

Gloo runs every collective on a worker thread and marks it finished before that thread lets go of the work, which
holds the call's tensors. A caller that drops its send buffer right after ``wait()`` (as the exchanges do, so that it
is not held beside what comes next) could then still find it allocated a few microseconds later, now and then: a
streamed CPU step's peak varied by one exchange pass's buffers from run to run (47 KB in 1.34 MB,
tests/ntp/test_memory_estimate.py, 2026-12-02). Waiting here until the worker has let go makes host memory follow the
code, so the memory plan can be checked against it. CUDA tensors are left alone: NCCL's own threads and the caching
allocator's stream bookkeeping decide when device memory is reused.
"""

from __future__ import annotations

import time

import torch

#: How long to wait for the worker to let go; past it the tensors are simply freed later (the worker was descheduled).
#: The waits seen are far shorter: at most 1.3 ms over 256 of a two-rank overlapped CPU run on a busy machine.
RELEASE_WAIT_S = 0.05


def _references(t: torch.Tensor) -> int:
    # a work holds the caller's tensors or views of them: both count (private accessors, long-standing ones that
    # torch's own tests use: references held from C++ are invisible otherwise)
    return t._use_count() + torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class HostTensors:
    """The host tensors of a collective, whose references (the caller's, the work's) can be counted."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._tensors = [t for t in tensors if isinstance(t, torch.Tensor) and not t.is_cuda]

    def counts(self) -> list[int]:
        return [_references(t) for t in self._tensors]

    def wait_down_to(self, counts: list[int]) -> None:
        """Wait until each tensor has at most its ``counts`` references (the worker has let go), then drop them."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        for t, count in zip(self._tensors, counts):
            while _references(t) > count and time.monotonic() < deadline:
                time.sleep(0)  # yield the GIL to the worker thread
        self._tensors = []


def run_released(op, *tensors: torch.Tensor, **kwargs):  # noqa: ANN001, ANN201 (a torch.distributed collective)
    """``op(*tensors, **kwargs)``; once it returns (an asynchronous call: once its handle's ``wait`` does), the host
    tensors are held by the caller alone."""
    host = HostTensors(*tensors)
    callers = host.counts()  # a synchronous call cannot change the caller's references
    work = op(*tensors, **kwargs)
    if work is None:
        host.wait_down_to(callers)
        return None
    return ReleasedWork(work, host, [now - c for now, c in zip(host.counts(), callers)])


class ReleasedWork:
    """An asynchronous collective's handle whose :meth:`wait` returns once the work is done and has let go of its
    host tensors (``works``: the references it holds to each; the caller may drop its own while in flight)."""

    def __init__(self, work, host: HostTensors, works: list[int]) -> None:  # noqa: ANN001 (a torch.distributed Work)
        self._work, self._host, self._works = work, host, works

    def get_future(self):  # noqa: ANN201 (a torch.futures.Future)
        return self._work.get_future()

    def wait(self) -> bool:
        if self._work is None:
            return True
        done = self._work.wait()
        left = [now - w for now, w in zip(self._host.counts(), self._works)]  # the work is alive: our handle
        self._work = None
        self._host.wait_down_to(left)
        return done
