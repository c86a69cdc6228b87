"""The memory plan of the largest graphs: device memory per GPU and host memory per machine for 1-16 GPUs, with the
NN stage on the device, with the topology offloaded, and with the NN stage streamed (--nn-device stream) beside the
column slice streamed too (--offload all) or kept on the GPU (--offload topology).

    python bench/plan.py                      # papers100M and a MAG240M-sized graph, GPUs of 16 and 80 GB
    python bench/plan.py --gpu-gb 16 --gpus-per-machine 1     # the NeutronTP paper's cluster shape

No GPU and no graph are needed: every figure comes from the formulas ``--memory-budget`` checks
(ntp.engine.memory.placement: what stays resident on a rank; the chunks of propagation take the rest) and, for the
host, from the bytes per edge ``bench/gpu.py`` measured last (bench/out/bytes_per_edge.json; design figures before
any run). A GPU fits when its resident parts leave room for chunks; "chunks" is how many propagation needs then
(each chunk a range of destination rows with all their edges: more chunks, more kernel launches, same bytes).
Streamed, "resident_GB" is what a product holds beside its chunks and "segment_GB" what the NN stage's segments hold
with their block, which is not alive in a product (ntp.engine.memory.phases); both must fit. Under --offload all a
run keeps the column slice on the GPU where it fits (ntp.engine.memory.offload.offloaded_layout): such a row is
planned as --offload topology ("slice_on_gpu").
"""

from __future__ import annotations

import json

from common import OUT, base_parser, report

from ntp.config import TrainConfig
from ntp.engine.device.precision import element_bytes
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.chunks import DEVICE_MARGIN, working_set_bytes
from ntp.engine.memory.host import stream_host_bytes
from ntp.engine.memory.offload import offloaded_layout
from ntp.engine.memory.parts import (
    PARAMETER_COPIES,
    rank_resident_parts,
    rank_slice_width,
    stream_parts,
)
from ntp.engine.memory.phases import beside_chunks, segment_bytes
from ntp.engine.nn.models import build_model

#: The graphs: ogbn-papers100M, and a homogeneous graph of MAG240M's size (its papers' 768 features on every node).
GRAPHS = {
    "papers100M": dict(nodes=111_059_956, edges=1_615_685_872, features=128, classes=172),
    "MAG240M-sized": dict(nodes=244_160_499, edges=1_728_364_232, features=768, classes=153),
}
#: How the NN stage and the topology are placed: TrainConfig options.
MODES = {
    "in-device": dict(),
    "--offload topology": dict(offload="topology"),
    "--nn-device stream --offload all": dict(nn_device="stream", offload="all"),
    "stream, offload all, bf16": dict(nn_device="stream", offload="all", precision="bf16"),
    # the column slice on the device, the rows in host memory: for GPUs that hold the slice but not the rows
    "stream, offload topology, bf16": dict(nn_device="stream", offload="topology", precision="bf16"),
}
GPUS = (1, 2, 4, 8, 16)
#: A bench/gpu.py figure from a graph with fewer edges is not used (per-vertex costs dominate it).
MEASURED_AT_LEAST_EDGES = 50_000_000
#: Host bytes per process besides its data (the interpreter, torch, CUDA's context).
PROCESS_BYTES = 1 << 30


def plan_row(
    graph: dict,
    mode_name: str,
    mode: dict,
    gpus: int,
    gpu_bytes: int,
    per_machine: int,
    host_b_per_edge: float,
    hidden: int,
) -> dict:
    """One configuration: what a GPU holds and how many chunks propagation needs in what is left, and what a
    machine's host memory holds."""
    n, e, f, classes = graph["nodes"], graph["edges"], graph["features"], graph["classes"]
    cfg = TrainConfig(model="gcn", arch="coupled", hidden=hidden, dropout=0.5, **mode)
    params = sum(p.numel() for p in build_model(cfg, f, classes).parameters())
    budget = int(gpu_bytes * DEVICE_MARGIN)
    shape = dict(
        num_nodes=n,
        num_edges=e,
        feature_dim=f,
        out_dim=classes,
        world=gpus,
        params=params,
        device_type="cuda",
        symmetric=False,
    )
    slice_width = rank_slice_width(cfg, classes, gpus)
    if cfg.nn_device == "stream":
        block, parts = stream_parts(cfg, room=budget, **shape)
        if cfg.offload == "all" and slice_stays_on_gpu(cfg, parts, n, e, slice_width, budget):
            cfg = cfg.replace(offload="topology")  # the same layout, planned as such
            block, parts = stream_parts(cfg, room=budget, **shape)
    else:
        block, parts = 0, rank_resident_parts(cfg, nn_on_device=True, **shape)
    resident = beside_chunks(parts)  # a streamed NN block is not alive during a product (ntp.engine.memory.phases)
    eb = element_bytes(cfg.precision)
    work = working_set_bytes(n, e, slice_width, eb)
    room = budget - resident if segment_bytes(parts) <= budget else 0
    local = min(gpus, per_machine)
    if cfg.nn_device == "stream":  # the rows and their activations stay in host memory, the parameters on the GPU
        host_rank = stream_host_bytes(cfg, num_nodes=n, feature_dim=f, out_dim=classes, world=gpus)
    else:  # each rank's row block of the features
        host_rank = eb * ceil_div(n, gpus) * f
    host = e * host_b_per_edge + local * (host_rank + PROCESS_BYTES)  # the topology once per machine, its ranks' shares
    return {
        "graph": graph["name"],
        "gpu_GB": gpu_bytes / 1e9,
        "gpus": gpus,
        "machines": ceil_div(gpus, per_machine),
        "mode": mode_name,
        "slice_on_gpu": cfg.offload != "all",
        "resident_GB": resident / 1e9,
        "segment_GB": segment_bytes(parts) / 1e9 if block else None,  # a streamed NN stage's segments: the block
        "fits": room > 0,
        "chunks": ceil_div(work, room) if room > 0 else None,
        "nn_block_rows": block or None,
        "params_GB": 4 * params * PARAMETER_COPIES / 1e9,
        "host_GB_per_machine": host / 1e9,
        "host_fits_256GB": host <= 256e9,
    }


def slice_stays_on_gpu(cfg, parts: dict[str, int], n: int, e: int, slice_width: int, budget: int) -> bool:  # noqa: ANN001
    """Whether ``--offload all`` beside a streamed NN stage (``cfg``: a TrainConfig; ``parts``: its rank's) keeps the
    column slice on the GPU, as a run decides it (ntp.engine.memory.offload.offloaded_layout: where it fits beside a
    chunk and streaming it would move more bytes; the largest degree unknown here)."""
    room, segment = budget - parts["parameters"], parts["NN block"]
    return offloaded_layout(n, e, slice_width, room, cfg.precision, segment=segment)[0] == 0


def plan(gpu_gbs, per_machine: int, host_b_per_edge: float, hidden: int, gpus=GPUS) -> list[dict]:
    rows = []
    for name, graph in GRAPHS.items():
        for gb in gpu_gbs:
            for mode_name, mode in MODES.items():
                for g in gpus:
                    rows.append(
                        plan_row(
                            {**graph, "name": name},
                            mode_name,
                            mode,
                            g,
                            int(gb * 1e9),
                            per_machine,
                            host_b_per_edge,
                            hidden,
                        )
                    )
    return rows


def measured_bytes_per_edge() -> dict:
    """Host bytes per edge of a machine: bench/gpu.py's last figure where it measured a large graph (on a small one
    per-vertex and per-process costs dominate), else the H200's at products scale (docs/benchmarks.md)."""
    path = OUT / "bytes_per_edge.json"
    measured = json.loads(path.read_text()) if path.is_file() else {}
    if measured.get("edges", 0) >= MEASURED_AT_LEAST_EDGES:
        return measured
    return {"host_B_per_edge": 8.4, "graph": "H200, products scale (docs/benchmarks.md, section 8)"}


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__, quick=False, threads=False)
    p.add_argument("--gpu-gb", type=float, nargs="+", default=[16, 80], help="GPU memory sizes (GB)")
    p.add_argument("--gpus-per-machine", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256, help="hidden width (NeutronTP's papers100M runs: 128)")
    args = p.parse_args(argv)
    measured = measured_bytes_per_edge()
    rows = plan(args.gpu_gb, args.gpus_per_machine, measured["host_B_per_edge"], args.hidden)
    report(
        "large-graph-plan",
        rows,
        {
            "host_from": measured["graph"],
            **measured,
            "hidden": args.hidden,
            "gpus_per_machine": args.gpus_per_machine,
            "margin": DEVICE_MARGIN,
            "model": "gcn coupled, 2 layers, dropout 0.5",
        },
    )


if __name__ == "__main__":
    main()
