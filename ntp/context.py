"""What a model needs to run on one rank: the graph operators, the collectives and the dropout stream."""
from __future__ import annotations

from functools import cached_property

import torch

from ntp.aggregate import CSR, EdgeWeightedTopology, SparseOperator, gcn_values, mean_values, sum_values, with_self_loops
from ntp.collectives import Comm, gather, split

#: Propagation operators by name. "gcn": D^-1/2 (A+I) D^-1/2; "mean": D^-1 A (SAGE); "mean_self": D^-1 (A+I);
#: "sum_root": A + I (GIN with eps = 0, existing self-loops kept as in PyG).
OPERATORS = ("gcn", "mean", "mean_self", "sum_root")


class GraphContext:
    """Per-rank state shared by all layers: the whole topology, the communicator, and the current step.

    Models talk to the graph only through four methods, so the execution mode lives here, not in the models:
    ``to_graph`` / ``from_graph`` move a row-layout matrix into and out of the *graph layout* (tensor parallel: the
    column layout, via split and gather), ``propagate`` / ``propagate_weighted`` apply an operator in the graph
    layout, and ``graph_cols`` says which columns of a matrix the graph layout holds here.
    """

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

    # -- the graph layout (tensor parallel: all rows, a column slice) ------------------------------------------
    def to_graph(self, z: torch.Tensor) -> torch.Tensor:
        return split(z, self.comm)

    def from_graph(self, h: torch.Tensor, width: int) -> torch.Tensor:
        return gather(h, self.comm, width)

    def graph_cols(self, width: int) -> tuple[int, int]:
        return self.comm.layout.cols(width)

    def propagate(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """``A_name @ h`` in the graph layout."""
        return self.operator(name)(h)

    def propagate_weighted(self, values: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``A(values) @ h`` over the attention topology (in-edges plus self-loops), in the graph layout."""
        return self.attention_topology.matmul(values, h)

    # -- operators -------------------------------------------------------------------------------------------------
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
