"""Runs inside the DGL environment (torch 2.2.1, dgl 2.1.0): mini-batch GraphSAGE with DGL's own neighbour sampler
for bench/time_to_accuracy.py. Input: one JSON argument {npz, fanouts, batch_size, lr, epochs, seconds, eval_every,
hidden, layers, dropout, threads}; the npz holds the CSR of in-neighbours (indptr, indices), x, y and the three splits.
Output: one JSON line {curve: [[training seconds, valid acc]], test_at: [[seconds, test acc]], batches_per_epoch}.

Training stops after ``epochs`` passes or once ``seconds`` of training time are spent. The clock runs over sampling, slicing features and labels, and the training step; evaluation (full-graph
inference, as DGL's example does it) is outside it, as ntp's evaluation is outside its epochs."""

import json
import time

import torch
import torch.nn.functional as F


def build_model(sizes: list[int], dropout: float):
    from dgl.nn import SAGEConv

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(sizes[:-1], sizes[1:]))
            self.dropout = torch.nn.Dropout(dropout)

        def forward(self, graphs, h):  # graphs: one block per layer, or the whole graph for every layer
            for i, layer in enumerate(self.layers):
                h = layer(graphs[i], h)
                if i < len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    return SAGE()


def main():
    import dgl
    from dgl_worker import read_job

    p, d, g = read_job()
    x, y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])
    split = {k: torch.from_numpy(d[k]) for k in ("train", "valid", "test")}
    sampler = dgl.dataloading.NeighborSampler(p["fanouts"])
    loader = dgl.dataloading.DataLoader(g, split["train"], sampler, batch_size=p["batch_size"], shuffle=True)
    torch.manual_seed(0)
    classes = int(y.max()) + 1
    model = build_model([x.shape[1]] + [p["hidden"]] * (p["layers"] - 1) + [classes], p["dropout"])
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"])

    @torch.no_grad()
    def evaluate():
        model.eval()
        pred = model([g] * p["layers"], x).argmax(1)
        model.train()
        return {k: float((pred[v] == y[v]).float().mean()) for k, v in split.items()}

    curve, test_at, elapsed, batches = [], [], 0.0, 0
    for _ in range(p["epochs"]):
        if elapsed >= p["seconds"]:
            break
        it = iter(loader)
        while elapsed < p["seconds"]:
            t0 = time.perf_counter()
            got = next(it, None)
            if got is None:
                break
            input_nodes, output_nodes, blocks = got
            opt.zero_grad()
            out = model(blocks, x[input_nodes])
            F.cross_entropy(out, y[output_nodes]).backward()
            opt.step()
            elapsed += time.perf_counter() - t0
            batches += 1
            if batches % p["eval_every"] == 0:
                acc = evaluate()
                curve.append([elapsed, acc["valid"]])
                test_at.append([elapsed, acc["test"]])
    print(json.dumps({"curve": curve, "test_at": test_at, "batches_per_epoch": len(loader), "dgl": dgl.__version__}))


if __name__ == "__main__":
    main()
