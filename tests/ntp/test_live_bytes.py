"""The counter that checks the memory plan on a CPU (tests/ntp/live_bytes.py) counts what a step makes, not what it
reads: a sparse tensor's indices made before the count are not new (the counter once counted the topology's columns
as a step's, and the plan's 16 B an edge covered them), and what a GPU rank would make in host memory is not its
device's."""

from __future__ import annotations

import torch

from tests.ntp.live_bytes import DeviceBytes, LiveBytes


def test_a_sparse_tensor_made_of_existing_indices_adds_nothing() -> None:
    crow, col = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([0, 1, 1], dtype=torch.int32)
    values = torch.ones(3)
    live = LiveBytes()
    with live:
        block = torch.sparse_csr_tensor(crow, col, values, size=(2, 2))
        _ = block.col_indices(), block.crow_indices(), block.values()
    assert live.peak == 0, f"{live.peak} B: views of the block's indices counted as new"
    with live:
        y = torch.ones(2, 4) * 2
    assert live.peak == 2 * y.numel() * 4, "the ones and their double are new"


def test_what_only_host_tensors_make_is_not_the_devices() -> None:
    from ntp.engine.device import transfer

    with DeviceBytes() as device:
        a = transfer.host_empty(1000, dtype=torch.float32, pinned=False).fill_(1)
        b = transfer.host_empty(1000, dtype=torch.float32, pinned=False).fill_(2)
        hosted = a + b  # autograd summing two host gradients: host memory on a GPU rank
        on_device = hosted + torch.ones(1000)  # with a tensor of the device's
    assert hosted.sum() == 3000
    assert device.peak == 2 * on_device.numel() * 4, f"{device.peak} B: the ones and the sum, not the host's"
