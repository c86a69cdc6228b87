"""Runs inside the DGL environment (torch 2.2.1, dgl 2.1.0): kernel and epoch timings for bench/kernel.py and
bench/epoch.py. Input: one JSON argument {task, npz, width, threads, repeats, ...}; output: one JSON line. With
"serve": true (bench/common.py:dgl_server) it prints {"ready": true} once the job is built, then for each number k
read from stdin runs k epochs and prints {"times": [...]}, until stdin closes."""

import json
import statistics
import sys
import time

import numpy as np
import torch


def timed(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def serve(step):
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"times": times}), flush=True)


def read_job():
    """The JSON payload (sys.argv[1]) with torch's threads set, the npz it names, and its graph in DGL: the npz's
    CSR of in-neighbours (indptr, indices) as edges source -> row."""
    import dgl

    p = json.loads(sys.argv[1])
    torch.set_num_threads(p["threads"])
    d = np.load(p["npz"])
    indptr, indices = torch.from_numpy(d["indptr"]), torch.from_numpy(d["indices"])
    n = len(indptr) - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    return p, d, dgl.graph((indices, dst), num_nodes=n)


def main():
    import dgl
    import dgl.function as fn

    p, d, g = read_job()
    n = g.num_nodes()
    out = {"dgl": dgl.__version__, "torch": torch.__version__}
    if p["task"] == "kernel":
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
        deg = g.in_degrees().float().clamp(min=1)
        s, t = g.edges()
        w = (deg[s].rsqrt() * deg[t].rsqrt()).unsqueeze(1)
        h = torch.randn(n, p["width"], requires_grad=True)
        grad = torch.randn(n, p["width"])
        g.edata["w"] = w

        def step():
            h.grad = None
            g.srcdata["h"] = h
            g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "o"))
            g.dstdata["o"].backward(grad)

        out["seconds"], out["times"] = timed(step, p["repeats"])
    else:
        from dgl.nn import GATConv, GraphConv, SAGEConv

        g = dgl.add_self_loop(dgl.remove_self_loop(g))
        x = torch.from_numpy(d["x"])
        y = torch.from_numpy(d["y"])
        train = torch.from_numpy(d["train"])
        hid, classes, heads, rate = p["hidden"], p["classes"], p["heads"], p.get("dropout", 0.5)
        torch.manual_seed(0)
        if p["model"] == "gcn":
            layers = torch.nn.ModuleList(
                [
                    GraphConv(x.shape[1], hid, allow_zero_in_degree=True),
                    GraphConv(hid, classes, allow_zero_in_degree=True),
                ]
            )

            def forward():
                h = torch.relu(layers[0](g, torch.nn.functional.dropout(x, rate)))
                return layers[1](g, torch.nn.functional.dropout(h, rate))
        elif p["model"] == "sage":
            layers = torch.nn.ModuleList([SAGEConv(x.shape[1], hid, "mean"), SAGEConv(hid, classes, "mean")])

            def forward():
                h = torch.relu(layers[0](g, torch.nn.functional.dropout(x, rate)))
                return layers[1](g, torch.nn.functional.dropout(h, rate))
        else:
            layers = torch.nn.ModuleList(
                [
                    GATConv(x.shape[1], hid // heads, heads, allow_zero_in_degree=True),
                    GATConv(hid // heads * heads, classes, 1, allow_zero_in_degree=True),
                ]
            )

            def forward():
                h = torch.nn.functional.elu(layers[0](g, torch.nn.functional.dropout(x, rate)).flatten(1))
                return layers[1](g, torch.nn.functional.dropout(h, rate)).mean(1)

        opt = torch.optim.Adam(layers.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(forward()[train], y[train])
            loss.backward()
            opt.step()

        if p.get("serve"):
            return serve(step)
        out["seconds"], out["times"] = timed(step, p["repeats"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
