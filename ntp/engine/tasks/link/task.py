"""Link prediction inside a rank: setup, one epoch of edge mini-batches, evaluation.

Every step reruns the encoder on the whole graph, scores a mini-batch of ``link_batch`` positive training edges and
as many negative pairs, and updates (as OGB's full-graph GCN/SAGE examples do; once per epoch would give one update
per epoch, and the examples' accuracy needs the many updates). The batch order and the negatives come from a
generator seeded by (seed, epoch) on every rank: the same batches for every world size. Negatives are uniform pairs
that are not edges of the message-passing graph (as PyG's ``negative_sampling``).

Loss: OGB's ``-log sigmoid(pos) - log(1 - sigmoid(neg))``, each averaged over the batch's k positives; each rank sums
the terms of its share of the pairs and divides by the global k, so the gradients summed over ranks are the
single-process gradients. The message-passing graph holds the training edges only (the store excludes validation
and test edges).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch

from ntp.config import TrainConfig
from ntp.engine.device import precision
from ntp.engine.distributed.collectives import Comm, all_reduce_gradients, check_same_on_all_ranks
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.distributed.partition import Partition, ceil_div
from ntp.engine.graph.data import GraphData, load_shared
from ntp.engine.kernels import streams
from ntp.engine.memory import offload, parts, placement
from ntp.engine.memory.chunks import ChunkPlan
from ntp.engine.parallel.context import GraphContext
from ntp.engine.tasks.base import (
    Job,
    make_optimizer,
    refuse_first_layer_decay,
    refuse_loss_monitor,
    refuse_section,
    refuse_split_and_metric,
)
from ntp.engine.tasks.link import memory as link_memory
from ntp.engine.tasks.link.data import LinkGraphData, read_link_splits, with_link_splits
from ntp.engine.tasks.link.metrics import link_evaluator
from ntp.engine.tasks.link.model import LinkModel, replicated_size
from ntp.engine.tasks.link.pairs import own_pair_scores, pair_chunk, score_pairs, train_pairs
from ntp.errors import ConfigError

#: Redraws of negatives that hit an edge before the rest are kept as they are (only a nearly complete graph needs more).
MAX_REDRAWS = 100


def _graph_keys(data: GraphData) -> torch.Tensor:
    """Sorted keys ``u * n + v`` of the message-passing graph's edges u -> v."""
    indptr, indices = np.asarray(data.indptr, np.int64), np.asarray(data.indices, np.int64)
    dst = np.repeat(np.arange(data.num_nodes, dtype=np.int64), np.diff(indptr))
    return torch.from_numpy(np.sort(indices * data.num_nodes + dst))


def _member(keys: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
    if len(taken) == 0:
        return torch.zeros(len(keys), dtype=torch.bool)
    at = torch.searchsorted(taken, keys).clamp(max=len(taken) - 1)
    return taken[at] == keys


def sample_negatives(gen: torch.Generator, n: int, k: int, taken: torch.Tensor) -> torch.Tensor:
    """``k`` uniform pairs [k, 2] that are not edges (sorted keys ``taken``), drawn from ``gen``."""
    pairs = torch.randint(0, n, (k, 2), generator=gen)
    todo = torch.arange(k)  # only redrawn pairs can hit an edge again
    for _ in range(MAX_REDRAWS):
        hit = todo[_member(pairs[todo, 0] * n + pairs[todo, 1], taken)]
        if len(hit) == 0:
            break
        pairs[hit] = torch.randint(0, n, (len(hit), 2), generator=gen)
        todo = hit
    return pairs


def _topology(data: GraphData) -> Any:
    """What GraphContext takes: the engine's shared topology (ntp.engine.graph.topology) or, in older layouts, the CSR."""
    topology = getattr(data, "topology", None)
    if topology is not None:
        return topology
    from ntp.engine.graph.aggregate import CSR

    return CSR.from_numpy(data.indptr, data.indices)


def graph_embeddings(job: Any) -> torch.Tensor:
    """The encoder's output on this rank's column slice of every node (the graph layout the decoder reads), float32
    on the rank's device: the all-to-all moves it in the run's precision (``--offload all`` leaves it in host
    memory), and the decoder scores pairs in float32 (close scores rank apart)."""
    h = job.model(job.x, job.ctx)
    return job.ctx.to_graph(h.to(precision.dtype(job.cfg.precision))).to(job.comm.device, torch.float32)


def memory_shape(data: LinkGraphData, model: LinkModel, world: int, device_type: str) -> dict[str, Any]:
    """What ntp.engine.tasks.link.memory plans a rank from: ``data`` and ``model`` on ``world`` ranks of ``device_type``."""
    return dict(
        num_nodes=data.num_nodes,
        num_edges=data.num_edges,
        feature_dim=data.feature_dim,
        splits=split_shapes(data.link_splits),
        world=world,
        params=sum(p.numel() for p in model.replicated()),
        device_type=device_type,
        symmetric=bool(getattr(getattr(data, "topology", None), "symmetric", False)),
    )


def streamed_parts(cfg: TrainConfig, shape: dict[str, Any], room: int) -> tuple[int, dict[str, int]]:
    """The rows of a streamed block of the encoder's NN stage (ntp.engine.memory.parts.stream_parts, from
    ``room``), and a link rank's parts with it streamed in such blocks (``shape``: :func:`memory_shape`'s)."""
    encoder = {k: v for k, v in shape.items() if k != "splits"}
    block, _ = parts.stream_parts(
        cfg, room=room, **{**encoder, "feature_dim": shape["feature_dim"] or cfg.hidden, "out_dim": cfg.hidden}
    )
    return block, link_memory.resident_parts(cfg, nn_on_device=False, row_block=block, **shape)


def split_shapes(splits: dict) -> dict:
    """By split, the shapes of its positive pairs and of its negatives (None: none), as ntp.engine.tasks.link.memory takes
    them."""
    return {k: (tuple(np.shape(p)), None if q is None else tuple(np.shape(q))) for k, (p, q) in splits.items()}


class LinkTask:
    """Link prediction (ntp.engine.tasks.base.Task): a job's edges, its training epoch and its evaluation."""

    kind = "link"
    exports = ("scores", "embeddings")
    exports_hint = (
        "a link prediction model scores pairs, not nodes: use --export scores --pairs FILE, or --export embeddings"
    )

    def check(self, cfg: TrainConfig) -> None:
        refuse_section(cfg, "rgcn", "link prediction")
        refuse_loss_monitor(cfg, "link prediction")
        refuse_split_and_metric(cfg, "link prediction", "the ranking metric chosen at `ntp data prepare --link-metric`")
        refuse_first_layer_decay(cfg, "link prediction")
        if not cfg.holds_out_valid:
            raise ConfigError(
                f"--fit-on {cfg.fit_on}: link prediction trains on the store's train edges and selects on its "
                "valid edges: drop --fit-on"
            )
        if cfg.mode == "data":
            raise ConfigError("link prediction runs tensor parallel: use --mode tp (or --mode single for one process)")

    def load(self, cfg: TrainConfig, env: DistEnv, store: Any) -> LinkGraphData:
        return with_link_splits(load_shared(store, env), read_link_splits(cfg.store))

    def build(self, cfg: TrainConfig, env: DistEnv, data: GraphData) -> Job:
        """The job that trains link prediction on ``data`` (in-memory data without edge splits reads the store's)."""
        self.check(cfg)
        if not isinstance(data, LinkGraphData):
            data = with_link_splits(data, read_link_splits(cfg.store))
        splits = data.link_splits
        n = data.num_nodes
        part = Partition(n, env.world, env.rank)
        check_same_on_all_ranks(
            "link graph (nodes, edges, features, splits)",
            (n, data.num_edges, data.feature_dim, split_shapes(splits), cfg.to_json()),
        )
        comm = Comm(part, env.device, group=None)
        model = LinkModel(cfg, n, data.feature_dim, part)
        shape = memory_shape(data, model, env.world, env.device.type)
        streamed = partial(streamed_parts, cfg, shape) if cfg.nn_streams else None
        placed = placement.place_nn_stage(
            cfg,
            env.device,
            link_memory.resident_parts(cfg, **shape),
            link_memory.reserved_parts(cfg, **shape),
            report=env.is_main,
            streamed=streamed,
            feature_bytes=placement.feature_bytes(n, data.feature_dim, env.world, cfg.precision),
            bus=partial(offload.offload_bus_bytes, _topology(data), ceil_div(cfg.hidden, env.world), cfg.precision),
        )
        # the decoder and the embeddings' slice: the graph layout's device; the encoder where its rows are, or
        # there too where its rows stream through it
        model.to(env.device).encoder.to(env.device if placed.row_block else placed.home)
        ctx = GraphContext(
            _topology(data),
            comm,
            chunk_rows=cfg.chunk_rows,
            seed=cfg.seed,
            memory_budget=cfg.memory_budget_bytes,
            overlap=cfg.overlap,
            offload=cfg.offload,
            width=cfg.hidden,
            nn_device=placed.home,
            reserved=placed.reserved,
            precision=cfg.precision,
            row_block=placed.row_block,
        )
        optimizer = make_optimizer(cfg, model.parameters())
        if model.embedding is not None:  # checkpoints hold its whole matrices: any world size resumes them
            model.embedding.track_optimizer(optimizer)
        self._prepare(splits, data.metric, data.ogb_name, n, _graph_keys(data), cfg.seed)
        x = torch.from_numpy(data.features).to(placed.features, precision.dtype(cfg.precision))
        if placed.row_block and env.device.type == "cuda" and not x.is_cuda:
            x = x.pin_memory()  # its blocks reach the device at the bus's speed
        return Job(
            cfg,
            env,
            data,
            comm,
            ctx,
            model,
            optimizer,
            x=x,
            y=torch.zeros(0),
            local_split={},
            global_train_count=len(splits["train"][0]),
            task=self,
        )

    def _prepare(
        self, splits: dict, metric: str, ogb_name: str | None, num_nodes: int, taken: torch.Tensor, seed: int
    ) -> None:
        """The edges of each split, the negatives' exclusions and the evaluation sets."""
        self.metric, self.n, self.taken = metric, num_nodes, taken
        self.score = link_evaluator(metric, ogb_name)
        as_tensor = lambda a: None if a is None else torch.from_numpy(np.asarray(a, np.int64))  # noqa: E731
        self.pos = {k: as_tensor(p) for k, (p, _) in splits.items()}
        self.neg = {k: as_tensor(q) for k, (_, q) in splits.items()}
        # OGB's examples report the training metric on as many random training edges as validation edges, ranked
        # against the validation negatives (MRR's negatives belong to their own positives: no training metric then)
        train = self.pos["train"]
        pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[: len(self.pos["valid"])]
        self.eval_sets = {"valid": (self.pos["valid"], self.neg["valid"]), "test": (self.pos["test"], self.neg["test"])}
        if metric != "mrr":
            self.eval_sets = {"train": (train[pick.sort().values], self.neg["valid"]), **self.eval_sets}

    def train_epoch(self, job: Job, epoch: int) -> float:
        """One epoch of mini-batch steps; returns the mean loss over the epoch's positive edges (all ranks)."""
        cfg, model, comm, ctx = job.cfg, job.model, job.comm, job.ctx
        model.train()
        pos = self.pos["train"]
        gen = torch.Generator().manual_seed(streams.stream(streams.Purpose.SAMPLING, cfg.seed, epoch))
        perm = torch.randperm(len(pos), generator=gen)
        steps = -(-len(pos) // cfg.link_batch)
        total = torch.zeros(1, dtype=torch.float64, device=comm.device)
        for b in range(steps):
            idx = perm[b * cfg.link_batch : (b + 1) * cfg.link_batch]
            k = len(idx)
            pairs = torch.cat([pos[idx], sample_negatives(gen, self.n, k, self.taken)]).to(comm.device)
            ctx.step = epoch * steps + b  # the encoder's dropout masks: one stream per step
            job.optimizer.zero_grad(set_to_none=True)
            h_cols = graph_embeddings(job)
            loss, h_grad = train_pairs(
                model, h_cols, pairs, k, comm, stream=streams.stream(streams.Purpose.DECODER, cfg.seed, ctx.step)
            )
            h_cols.backward(h_grad)  # the encoder's (and the embeddings') backward, once for all chunks
            all_reduce_gradients(model.replicated(), comm)
            if cfg.clip_grad:
                clip_gradients(model, comm, cfg.clip_grad)
            job.optimizer.step()
            total += loss * k
        return float(comm.all_reduce(total)[0]) / len(pos)

    @torch.no_grad()
    def evaluate(self, job: Job, outputs: torch.Tensor | None = None) -> dict[str, float]:
        """The metric on train (a sample, see _prepare), valid and test, identical on every rank (the encoder runs
        again whatever ``outputs`` is: the pairs are scored in the graph layout)."""
        job.model.eval()
        h_cols = graph_embeddings(job)
        out, scored = {}, {}  # the training sample's negatives are the validation ones: scored once
        for split, (pos, neg) in self.eval_sets.items():
            s_pos = score_pairs(job.model, h_cols, pos, job.comm)
            if self.metric == "mrr":  # negatives [E, K]: targets for each positive's source
                s_neg = _source_target_scores(job, h_cols, pos[:, 0], neg)
            else:
                if id(neg) not in scored:
                    scored[id(neg)] = score_pairs(job.model, h_cols, neg, job.comm)
                s_neg = scored[id(neg)]
            out[split] = self.score(s_pos, s_neg)
        return out

    def gather_state(self, job: Job, with_optimizer: bool = False) -> None:
        """The node embedding whole (and its optimiser state), for the state the loop keeps or checkpoints."""
        if job.model.embedding is not None:
            job.model.embedding.snapshot(job.ctx, with_optimizer=with_optimizer)

    def output_rows(self, job: Job) -> Partition:
        return Partition(job.data.num_nodes, job.env.world, job.env.rank)

    def target_type(self, job: Job) -> str:
        return ""

    def layer_rows(self, job: Job, output: torch.Tensor) -> torch.Tensor:
        return output

    def check_store(self, cfg: TrainConfig, store: Any) -> None:
        self.check(cfg)  # it trains on the store's edge splits (always non-empty)

    def plan(self, cfg: TrainConfig, store: Any, world: int, device: str, mode: str) -> ChunkPlan | None:
        if not cfg.memory_budget_bytes or cfg.chunk_rows:
            return None
        meta = store.meta
        shape = dict(
            num_nodes=meta.num_nodes,
            num_edges=meta.num_edges,
            feature_dim=meta.feature_dim,
            splits={name: store.link_split_shapes(name) for name in meta.split_names},
            world=world,
            params=replicated_size(cfg, meta.feature_dim),
            device_type=device,
            symmetric=bool(meta.preprocessing.get("symmetrized")),
        )
        if cfg.nn_device == "stream":  # the ranks size the blocks from the budget alike
            resident = streamed_parts(cfg, shape, room=cfg.memory_budget_bytes)[1]
        else:
            resident = link_memory.resident_parts(
                cfg, nn_on_device=device == "cpu" or cfg.nn_device == "device", **shape
            )
        return placement.store_plan(cfg, store, world, device, resident, cfg.hidden)

    @torch.no_grad()
    def pair_scores(self, job: Job, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of ``pairs`` [P, 2] (their indices) and their scores (the decoder's logits)."""
        return own_pair_scores(job.model, graph_embeddings(job), pairs, job.comm)


def _source_target_scores(job: Any, h_cols: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Scores [E, K] of the pairs (sources[e], targets[e, k]), formed a block of sources at a time (about a chunk of
    pairs: ntp.engine.tasks.link.pairs.pair_chunk) rather than all E x K at once."""
    block = max(1, pair_chunk(job.comm.device.type) // max(targets.shape[1], 1))
    scores = []
    for e in range(0, len(sources), block):
        t = targets[e : e + block]
        pairs = torch.stack([sources[e : e + block, None].expand_as(t).reshape(-1), t.reshape(-1)], 1)
        scores.append(score_pairs(job.model, h_cols, pairs, job.comm).view(t.shape))
    return torch.cat(scores) if scores else torch.zeros(targets.shape)


def clip_gradients(model: LinkModel, comm: Comm, max_norm: float) -> None:
    """As OGB's examples: the embeddings, the encoder and the decoder each clipped to ``max_norm`` (torch's
    clip_grad_norm_); the sliced embeddings' norm is summed over ranks."""
    groups = [list(model.encoder.parameters()), list(model.decoder.parameters())]
    for params in groups:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            _scale(grads, torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])), max_norm)
    emb = model.embedding
    if emb is not None and emb.weight.grad is not None:
        sq = comm.all_reduce(emb.weight.grad.pow(2).sum().reshape(1).double())
        _scale([emb.weight.grad], sq.sqrt()[0].float(), max_norm)


def _scale(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
