"""Which host tensors ``--offload`` locks for a GPU to read in place: those whose pages hold nothing else."""

from __future__ import annotations

import numpy as np
import torch

from ntp.engine.device import page_lock
from ntp.engine.device.page_lock import owns_its_pages


def test_only_tensors_on_pages_of_their_own_are_locked(tmp_path) -> None:
    """A file's mapping (how a machine's ranks share the topology) holds the file's bytes only, any slice of it too;
    an allocation of 32 MiB or more has a mapping of its own from glibc; a smaller one may share heap pages with
    other objects, so it is staged instead; so is an empty one. A view is judged, and locked, by its whole storage:
    a copy from the rest of the storage must not span locked and unlocked pages."""
    path = tmp_path / "indices.npy"
    np.save(path, np.arange(1 << 16, dtype=np.int32))
    mapped = torch.from_numpy(np.load(path, mmap_mode="r+"))
    assert page_lock._mapped_file(*page_lock._pages(mapped)) == str(path)
    assert owns_its_pages(mapped) and owns_its_pages(mapped[1000:2000])
    assert not owns_its_pages(torch.arange(1000, dtype=torch.int32)), "a few KB: heap pages"
    assert not owns_its_pages(torch.empty(1 << 20, dtype=torch.int32)), "4 MiB: may lie in the heap"
    big = torch.empty(8 << 20, dtype=torch.int32)
    assert owns_its_pages(big), "32 MiB: a mapping of its own"
    assert owns_its_pages(big[10:20]) and page_lock._pages(big[10:20]) == page_lock._pages(big)
    assert page_lock._pages(mapped[1000:2000]) == page_lock._pages(mapped)
    assert not owns_its_pages(torch.empty(0, dtype=torch.int32)) and not owns_its_pages(mapped[5:5])
