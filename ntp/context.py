"""What a model needs to run on one rank: the graph operators, the collectives and the dropout stream."""
from __future__ import annotations

from functools import cached_property

import torch

from ntp.aggregate import CSR, EdgeWeightedTopology, SparseOperator, gcn_values, mean_values, sum_values, with_self_loops
from ntp.collectives import Comm

#: Propagation operators by name. "gcn": D^-1/2 (A+I) D^-1/2; "mean": D^-1 A (SAGE); "mean_self": D^-1 (A+I);
#: "sum_root": A + I (GIN with eps = 0, existing self-loops kept as in PyG).
OPERATORS = ("gcn", "mean", "mean_self", "sum_root")


class GraphContext:
    """Per-rank state shared by all layers: the whole topology, the communicator, and the current step."""

    def __init__(self, csr: CSR, comm: Comm, *, chunk_rows: int = 0, seed: int = 0) -> None:
        self.csr = csr
        self.comm = comm
        self.chunk_rows = chunk_rows
        self.seed = seed
        self.step = 0  #: training step (epoch): part of the dropout key, so masks are reproducible on resume
        self._operators: dict[str, SparseOperator] = {}

    @property
    def device(self) -> torch.device:
        return self.comm.device

    @property
    def row_offset(self) -> int:
        return self.comm.layout.rows()[0]

    def operator(self, name: str) -> SparseOperator:
        if name not in self._operators:
            self._operators[name] = self._build_operator(name)
        return self._operators[name]

    def _build_operator(self, name: str) -> SparseOperator:
        if name == "gcn":
            pattern = with_self_loops(self.csr)
            values = gcn_values(pattern)
        elif name == "mean":
            pattern, values = self.csr, mean_values(self.csr)
        elif name == "mean_self":
            pattern = with_self_loops(self.csr)
            values = mean_values(pattern)
        elif name == "sum_root":
            pattern = with_self_loops(self.csr, keep_existing=True)
            values = sum_values(pattern)
        else:
            raise ValueError(f"unknown operator {name!r}; known: {OPERATORS}")
        return SparseOperator(pattern, values, self.chunk_rows, self.device)

    @cached_property
    def attention_topology(self) -> EdgeWeightedTopology:
        """In-edges plus one self-loop per vertex (as GATConv), for attention-weighted propagation."""
        return EdgeWeightedTopology(with_self_loops(self.csr), self.device)
