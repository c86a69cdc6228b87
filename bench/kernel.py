"""Benchmark 1: graph aggregation forward + backward (GCN-normalised A @ H, then A^T @ G), same graph, same threads.

    python bench/kernel.py --quick                 # 100k-vertex synthetic graph, width 64
    python bench/kernel.py --graphs synthetic cornell5 tolokers --size big --with-dgl

Compared: ntp.engine.graph.aggregate.SparseOperator (CSR forward, precomputed CSR of A^T backward); PyTorch Geometric as its users
run it (a MessagePassing propagate over edge_index with edge weights, the path of GCNConv on edge_index input; and
PyG's torch.sparse CSR path, torch_geometric.utils.spmm on adj_t); DGL update_all(u_mul_e, sum) in its own environment.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from common import (
    add_graph_arguments,
    add_single_process_arguments,
    base_parser,
    graph_selection,
    graph_stores,
    load_arrays,
    report,
    run_dgl,
    single_process_settings,
    time_median,
)


def main() -> None:
    p = base_parser(__doc__, repeats=True)
    add_graph_arguments(p)
    p.add_argument("--width", type=int, default=64)
    add_single_process_arguments(p)
    p.add_argument("--no-pyg-scatter", action="store_true", help="skip PyG's (slow) scatter path")
    args = p.parse_args()
    size, graphs = graph_selection(args, full_size="big")
    repeats, threads, dgl_py, dgl_note = single_process_settings(args)

    from ntp.engine.graph.aggregate import RowBlocks, SparseOperator
    from ntp.engine.graph.operators import CSR, gcn_values, scaling, with_self_loops
    from ntp.engine.graph.topology import from_csr

    rows = []
    for gname, store in graph_stores(graphs, size).items():
        a = load_arrays(store)
        csr = with_self_loops(CSR.from_numpy(a["indptr"], a["indices"]))
        values = gcn_values(csr)
        n, nnz = csr.num_nodes, csr.num_edges
        h = torch.randn(n, args.width, requires_grad=True)
        grad = torch.randn(n, args.width)
        topo = from_csr(a["indptr"], a["indices"])  # what ntp runs: unit-weight topology, GCN as a scaling
        cpu = torch.device("cpu")
        forward = RowBlocks(topo.indptr, topo.indices, [0, n], cpu)
        backward = forward if topo.symmetric else RowBlocks(topo.t_indptr, topo.t_indices, [0, n], cpu)
        op = SparseOperator(forward, backward, scaling(topo, "gcn"))

        def ntp_step():
            h.grad = None
            op(h).backward(grad)

        t_ntp, _ = time_median(ntp_step, repeats)
        row = {
            "graph": gname,
            "nodes": n,
            "edges_with_self_loops": nnz,
            "width": args.width,
            "threads": threads,
            "ntp_s": t_ntp,
        }

        from torch_geometric.nn import MessagePassing
        from torch_geometric.utils import spmm

        dst = csr.edge_rows()
        edge_index = torch.stack([csr.indices, dst])
        adj_t = torch.sparse_csr_tensor(csr.indptr, csr.indices, values, size=(n, n))

        def pyg_sparse_step():
            h.grad = None
            spmm(adj_t, h, reduce="sum").backward(grad)

        row["pyg_spmm_s"], _ = time_median(pyg_sparse_step, repeats)
        if not args.no_pyg_scatter:

            class Agg(MessagePassing):
                def __init__(self):
                    super().__init__(aggr="add")

                def forward(self, x, ei, w):
                    return self.propagate(ei, x=x, w=w)

                def message(self, x_j, w):
                    return w.view(-1, 1) * x_j

            agg = Agg()

            def pyg_scatter_step():
                h.grad = None
                agg(h, edge_index, values).backward(grad)

            row["pyg_mp_s"], _ = time_median(pyg_scatter_step, max(1, repeats // 2 if n > 1_000_000 else repeats))
        if dgl_py is not None:
            with tempfile.TemporaryDirectory() as tmp:
                npz = Path(tmp) / "g.npz"
                np.savez(npz, indptr=a["indptr"], indices=a["indices"])
                res = run_dgl(
                    dgl_py,
                    "dgl_worker.py",
                    {"task": "kernel", "npz": str(npz), "width": args.width, "threads": threads, "repeats": repeats},
                )
            row["dgl_s"] = res["seconds"] if res else None
        row["pyg_spmm/ntp"] = row["pyg_spmm_s"] / t_ntp
        if "pyg_mp_s" in row:
            row["pyg_mp/ntp"] = row["pyg_mp_s"] / t_ntp
        if row.get("dgl_s"):
            row["dgl/ntp"] = row["dgl_s"] / t_ntp
        rows.append(row)
        op = h = grad = adj_t = None  # the graph's tensors go before the next graph's (the closures above hold names)
    report(
        "kernel",
        rows,
        {
            "size": size,
            "width": args.width,
            "repeats": repeats,
            "threads": threads,
            "dgl": dgl_note,
            "allocator": args.allocator,
        },
    )


if __name__ == "__main__":
    main()
