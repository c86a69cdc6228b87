"""`ntp data prepare` and `ntp data info` (also runnable as `python -m storage.cli`). Registering the commands
imports no Zarr or array code: each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from storage.schema import FEATURE_DTYPES, SPLIT_PER_CLASS

PREPARE_EPILOG = """\
examples:
  ntp data prepare ogbn-arxiv                        download from OGB into --data-dir
  ntp data prepare ogbn-arxiv --mirror http://host/ogb   same zip from a mirror folder
  ntp data prepare cora --from-dir ../shared/datasets/ogb-layout/cora
  ntp data prepare synthetic --nodes 1000000 --avg-degree 20 --features 64 --classes 10
  ntp data prepare tolokers --from-npz ../shared/datasets/heterophilous/tolokers.npz   10 split sets, ROC-AUC
  ntp data prepare coauthor-cs --from-dir ../shared/datasets/ogb-layout/coauthor-cs --random-splits 10   Shchur et al.'s
  ntp data prepare mygraph --edges e.parquet --node-features x.npy --labels y.npy --splits splits/
  ntp data prepare ogbl-ddi --from-dir ../shared/datasets/ogb-link/ogbl-ddi    link prediction (OGB layout)
  ntp data prepare cora --from-dir ../shared/datasets/ogb-layout/cora --link-split 0.05,0.1
  ntp data prepare aifb --from-dir ../shared/datasets/ogb-hetero/aifb --add-reverse   heterogeneous (ogbn-mag layout)

The same inputs and options always map to the same store, which is built once. The store's
path is printed as the last line of standard output; progress goes to standard error.
"""


def _prepare_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="build a graph store (or find the existing one)",
        description="Build a graph store from an OGB dataset, an OGB-layout folder, "
        "an edge list or the synthetic generator.",
        epilog=PREPARE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "name",
        help="OGB dataset name (e.g. ogbn-arxiv), 'synthetic', 'edgelist', or any "
        "name together with --from-dir or --edges",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from-dir", metavar="DIR", help="an unzipped OGB-layout folder (raw/, split/); offline")
    src.add_argument(
        "--from-npz",
        metavar="FILE",
        help="a heterophilous-benchmark .npz (node_features, node_labels, edges, train/val/test_masks; e.g. "
        "tolokers.npz): every split set kept (`ntp train --split K`), edges symmetrised, 2-class tasks scored "
        "by ROC-AUC",
    )
    src.add_argument("--mirror", metavar="URL", help="base URL serving the OGB zip under its official name")
    p.add_argument("--data-dir", metavar="DIR", help="where downloads and stores go (default: $NTP_DATA_DIR or ./data)")
    p.add_argument("--out", metavar="STORE", help="store path (default: DATA_DIR/stores/NAME-HASH)")
    g = p.add_argument_group("preprocessing")
    g.add_argument("--symmetrize", action="store_true", help="add reverse edges (implies --dedup)")
    g.add_argument("--self-loops", action="store_true", help="give every vertex exactly one self-loop")
    g.add_argument("--dedup", action="store_true", help="remove repeated edges")
    g.add_argument("--drop-self-loops", action="store_true", help="remove all self-loops")
    g.add_argument(
        "--add-reverse",
        action="store_true",
        help="heterogeneous graphs: add the reverse rev_REL (dst "
        "-> src) of every relation, as R-GCN and the ogbn-mag baselines use (PyG's ToUndirected)",
    )
    g.add_argument(
        "--normalize-features",
        action="store_true",
        help="divide each vertex's features by their L1 norm (zero rows stay zero): Kipf & Welling's row "
        "normalisation of bag-of-words features, PyG's NormalizeFeatures",
    )
    g.add_argument(
        "--largest-component",
        action="store_true",
        help="keep only the largest connected component (edges taken as undirected), vertices renumbered in order: "
        "how Shchur et al. evaluate Amazon and Coauthor graphs, PyG's LargestConnectedComponents",
    )
    g.add_argument(
        "--feature-dtype",
        choices=FEATURE_DTYPES,
        default="float32",
        help="storage type of node features (read back as float32; default float32)",
    )
    s = p.add_argument_group("synthetic graphs")
    s.add_argument(
        "--nodes", type=int, help="number of vertices (default 10000; for edgelist: overrides the inferred count)"
    )
    s.add_argument("--avg-degree", type=float, help="average degree (default 10)")
    s.add_argument("--features", type=int, help="feature width (default 32)")
    s.add_argument("--classes", type=int, help="number of classes (default 8)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    e = p.add_argument_group("your own graph (edgelist)")
    e.add_argument("--edges", metavar="FILE", help="Parquet or CSV with src,dst[,weight] columns")
    e.add_argument("--node-features", metavar="FILE", help=".npy [n, F] or Parquet (one column per feature)")
    e.add_argument("--labels", metavar="FILE", help=".npy or Parquet (int, -1 = unlabeled)")
    e.add_argument("--splits", metavar="DIR", help="folder with train/valid/test .npy or .csv id files")
    r = p.add_argument_group("node splits")
    r.add_argument(
        "--random-splits",
        type=int,
        metavar="N",
        help="replace the graph's split with N seeded (--seed) random splits, class-balanced as Shchur et al. "
        "draw them (--split-per-class); `ntp train --split K` picks one, `--splits all` runs them all",
    )
    r.add_argument(
        "--split-per-class",
        metavar="TRAIN,VALID",
        default=SPLIT_PER_CLASS,
        help=f"with --random-splits: labelled vertices a class for train and valid, the rest test "
        f"(default {SPLIT_PER_CLASS})",
    )
    k = p.add_argument_group("link prediction")
    k.add_argument(
        "--link-split",
        metavar="VAL,TEST",
        help="make a link-prediction store: a seeded (--seed) random "
        "split of the edges into train/valid/test with as many negatives as positives (e.g. 0.05,0.1); "
        "the message-passing graph keeps the training edges only",
    )
    k.add_argument(
        "--link-metric",
        default="hits@20",
        help="metric of a --link-split store: hits@K or rocauc (default hits@20); OGB link datasets use OGB's",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild even if the store exists (only ever replaces a graph store, never another directory)",
    )
    p.set_defaults(func=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> int:
    from storage.prepare import prepare

    path = prepare(
        args.name,
        from_dir=args.from_dir,
        from_npz=args.from_npz,
        mirror=args.mirror,
        data_dir=args.data_dir,
        out=args.out,
        symmetrize=args.symmetrize,
        self_loops=args.self_loops,
        dedup=args.dedup,
        drop_self_loops=args.drop_self_loops,
        feature_dtype=args.feature_dtype,
        nodes=args.nodes,
        avg_degree=args.avg_degree,
        features=args.features,
        classes=args.classes,
        seed=args.seed,
        edges=args.edges,
        node_features=args.node_features,
        labels=args.labels,
        splits=args.splits,
        force=args.force,
        link_split=args.link_split,
        link_metric=args.link_metric,
        add_reverse=args.add_reverse,
        normalize_features=args.normalize_features,
        largest_component=args.largest_component,
        random_splits=args.random_splits,
        split_per_class=args.split_per_class,
    )
    print(path, flush=True)
    return 0


def _info_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info", help="show a store's metadata", description="Validate a graph store and show its metadata."
    )
    p.add_argument(
        "store",
        help="path of a store built by `ntp data prepare`, or its URL on object storage "
        "(s3://bucket/store, with the s3 extra)",
    )
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p.add_argument("--verify", action="store_true", help="also read every array and check its checksum")
    p.set_defaults(func=_run_info)


def _run_info(args: argparse.Namespace) -> int:
    from storage.reader import open_store

    store = open_store(args.store)
    if args.verify:
        store.verify()
    meta = {**store.meta.to_dict(), "path": str(store.location)}
    if args.json:
        print(json.dumps(meta, indent=2))
        return 0
    for key in (
        "path",
        "name",
        "num_nodes",
        "num_edges",
        "feature_dim",
        "feature_dtype",
        "num_classes",
        "task_type",
        "metric",
        "num_tasks",
        "directed",
        "has_edge_weights",
        "split_names",
        "preprocessing",
        "source",
        "fingerprint",
        "schema_version",
        "rebuild_command",
    ):
        print(f"{key:17} {meta[key]}")
    if store.meta.task_type == "link":
        for name in store.meta.split_names:
            pos, neg = store.link_split(name)
            print(
                f"{'link ' + name:17} {len(pos)} positive edges, "
                + (f"{len(neg)} negatives {list(neg.shape)}" if neg is not None else "negatives sampled in training")
            )
    if store.meta.hetero:
        _print_hetero(store.meta.hetero)
    return 0


def _print_hetero(hetero: dict) -> None:
    """Node types (count, features) and relations (edges), as PyG's HeteroData prints them."""
    for t in hetero["node_types"]:
        target = "  (target: labels and splits)" if t["name"] == hetero["target"] else ""
        features = f"{t['feature_dim']} features" if t["feature_dim"] else "no features (learned embeddings)"
        print(f"{'node type':17} {t['name']}: {t['count']} nodes, {features}, global ids from {t['offset']}{target}")
    for r in hetero["relations"]:
        rev = f"  (reverse of {r['reverse_of']})" if r["reverse_of"] else ""
        print(f"{'relation':17} ({r['src']}, {r['name']}, {r['dst']}): {r['num_edges']} edges{rev}")


def add_data_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `data prepare` and `data info` on an argparse subparsers object."""
    data = subparsers.add_parser(
        "data", help="build and inspect graph stores", description="Build and inspect graph stores."
    )
    sub = data.add_subparsers(dest="data_command", metavar="{prepare,info}", required=True)
    _prepare_parser(sub)
    _info_parser(sub)
    return data


def run(args: argparse.Namespace) -> int:
    """Call the chosen subcommand; StoreError and bad input give one line on stderr and exit 2."""
    from storage.schema import StoreError

    try:
        return args.func(args)
    except (StoreError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ntp", description="Graph store commands.")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
