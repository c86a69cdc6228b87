"""Runs inside the DGL environment (torch 2.2.1, dgl 2.1.0): R-GCN epoch time with DGL's RelGraphConv for
bench/hetero_speed.py, the same model as there (per-type Linear or embedding input, R-GCN layers with mean
aggregation, root weight and bias, Adam). Input: one JSON argument {npz, hidden, layers, repeats, threads};
output: one JSON line."""

import json
import sys
import time

import numpy as np
import torch
from dgl_worker import timed  # bench/ is this script's folder: the DGL environment's shared timing


def mean_norm(dst: torch.Tensor, etype: torch.Tensor, num_rels: int) -> torch.Tensor:
    """1 / |N_r(v)| per edge: RelGraphConv sums, R-GCN's mean divides by the in-degree per relation."""
    key = dst * num_rels + etype
    return (1.0 / torch.bincount(key).float())[key].unsqueeze(1)


def main() -> None:
    import dgl
    from dgl.nn import RelGraphConv

    p = json.loads(sys.argv[1])
    torch.set_num_threads(p["threads"])
    d = np.load(p["npz"])
    t0 = time.perf_counter()
    types = [str(t) for t in d["types"]]
    counts = d["counts"].tolist()
    n, num_rels = int(sum(counts)), int(d["num_rels"])
    etype = torch.from_numpy(d["etype"])
    order = torch.argsort(etype, stable=True)  # DGL's fast path: edges sorted by type (presorted=True)
    src, dst, etype = torch.from_numpy(d["src"])[order], torch.from_numpy(d["dst"])[order], etype[order]
    g = dgl.graph((src, dst), num_nodes=n)
    norm = mean_norm(dst, etype, num_rels)
    torch.manual_seed(0)
    hid, classes = p["hidden"], int(d["classes"])
    feats = {t: torch.from_numpy(d[f"x_{t}"]) for t in types if f"x_{t}" in d}
    inputs = torch.nn.ModuleDict(
        {
            t: torch.nn.Linear(feats[t].shape[1], hid) if t in feats else torch.nn.Embedding(c, hid)
            for t, c in zip(types, counts)
        }
    )
    dims = [hid] * p["layers"] + [classes]
    convs = torch.nn.ModuleList(RelGraphConv(a, b, num_rels, self_loop=True) for a, b in zip(dims[:-1], dims[1:]))
    opt = torch.optim.Adam(list(inputs.parameters()) + list(convs.parameters()), lr=0.01)
    off = int(sum(counts[: types.index(str(d["target"]))]))
    train = torch.from_numpy(d["train"]).long()
    y = torch.from_numpy(d["labels"]).long()[train]
    setup_s = time.perf_counter() - t0

    def epoch():
        opt.zero_grad()
        h = torch.cat([inputs[t](feats[t]) if t in feats else inputs[t].weight for t in types])
        for i, conv in enumerate(convs):
            h = conv(g, h, etype, norm, presorted=True)
            h = torch.relu(h) if i < len(convs) - 1 else h
        loss = torch.nn.functional.cross_entropy(h[off + train], y)
        loss.backward()
        opt.step()

    epoch_s, _ = timed(epoch, p["repeats"])
    peak = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))) * 1024
    print(
        json.dumps(
            {
                "epoch_s": epoch_s,
                "setup_s": setup_s,
                "peak_rss_mb": peak / 2**20,
                "dgl": dgl.__version__,
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
