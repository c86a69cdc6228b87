"""The process-group lifecycle (ntp.engine.distributed.dist): leaving the job really tears the group down."""

from __future__ import annotations

import os
from pathlib import Path

from tests.ntp.spawn import run_on_ranks


def _gloo_threads() -> list[str]:
    names = (Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
    return sorted(n for n in names if "gloo" in n)


def _train_a_step_and_leave() -> tuple[list[str], list[str]]:
    import torch

    from ntp.engine.distributed.dist import distributed

    with distributed(60, "cpu"):
        model = torch.nn.Linear(4, 2)
        torch.optim.Adam(model.parameters()).step()  # the first optimiser imports torch._dynamo
        grad = torch.ones(2)
        torch.distributed.all_reduce(grad)
        during = _gloo_threads()
    return during, _gloo_threads()


def test_leaving_the_job_stops_gloos_threads_before_the_interpreter_exits() -> None:
    # Threads still running at interpreter exit can abort a rank that trained correctly (SIGABRT after "done").
    for during, after in run_on_ranks(_train_a_step_and_leave, 2):
        assert during, "the check sees no gloo threads at all; it would pass for the wrong reason"
        assert after == []
