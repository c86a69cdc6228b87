"""prepare(): turn a dataset name plus options into a built store path (idempotent)."""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from storage.build import build
from storage.components import with_largest_component
from storage.csr import Preprocessing
from storage.features import with_normalized_features
from storage.inputs import Digests, file_identity, tree_identity
from storage.layout import Layout
from storage.link_split import parse_ratios, with_link_split
from storage.location import is_url
from storage.paths import default_data_dir, default_store_path, options_digest, raw_dir
from storage.progress import stderr_progress
from storage.random_splits import checked_options, with_random_splits
from storage.schema import FEATURE_DTYPES, SPLIT_PER_CLASS, StoreError
from storage.sources.base import GraphSource
from storage.sources.download import fetch_ogb
from storage.sources.edgelist import edgelist_source
from storage.sources.heterophilous import heterophilous_source
from storage.sources.ogb_hetero import is_hetero_folder, ogb_hetero_source
from storage.sources.ogb_layout import ogb_layout_source
from storage.sources.ogb_meta import ogb_info, ogb_table
from storage.sources.synthetic import SyntheticSpec, synthetic_source

PathLike = str | Path | None


def _path(p: PathLike) -> Path | None:
    return None if p is None else Path(p).expanduser().resolve()


def _file_id(p: Path | None, digests: Digests) -> list[Any] | None:
    """The input's path and content digest: a store is reused only for the same bytes."""
    if p is None:
        return None
    if not p.exists():
        raise StoreError(f"{p} does not exist. Fix: check the path")
    return file_identity(p, digests)


def _check_sizes(nodes: int | None, avg_degree: float | None, features: int | None, classes: int | None) -> None:
    """A size the user gave must be a size: 0 or less never falls back to a default."""
    for flag, value in (("--nodes", nodes), ("--features", features), ("--classes", classes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise StoreError(
                f"{flag} {value} is not a valid size. Fix: pass {flag} N with a whole N >= 1, "
                "or leave it out for the default"
            )
    if avg_degree is not None and not (math.isfinite(avg_degree) and avg_degree >= 0):
        raise StoreError(f"--avg-degree {avg_degree} is not a valid degree. Fix: pass a number >= 0")


def prepare(
    name: str,
    *,
    from_dir: PathLike = None,
    from_npz: PathLike = None,
    mirror: str | None = None,
    data_dir: PathLike = None,
    out: PathLike = None,
    symmetrize: bool = False,
    self_loops: bool = False,
    dedup: bool = False,
    drop_self_loops: bool = False,
    feature_dtype: str = "float32",
    nodes: int | None = None,
    avg_degree: float | None = None,
    features: int | None = None,
    classes: int | None = None,
    seed: int = 0,
    edges: PathLike = None,
    node_features: PathLike = None,
    labels: PathLike = None,
    splits: PathLike = None,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    layout: Layout | None = None,
    link_split: str | None = None,
    link_metric: str = "hits@20",
    add_reverse: bool = False,
    normalize_features: bool = False,
    random_splits: int | None = None,
    split_per_class: str = SPLIT_PER_CLASS,
    largest_component: bool = False,
) -> Path:
    """Build (or find) the store for `name` and these options; return its path.

    name: an OGB node-property dataset (downloaded, or read from `from_dir`), any name with `from_npz` (the
    heterophilous benchmarks' .npz, storage.sources.heterophilous: all split sets kept, edges symmetrised), "synthetic",
    "edgelist" (or any name with `edges`), or any name with `from_dir` (an OGB-layout folder).
    Default location: <data_dir>/stores/<name>-<hash of the inputs' bytes and the options>.
    layout: chunk sizes (storage.layout.Layout); they do not change content or the store's path.
    link_split: "VAL,TEST" fractions: a seeded (``seed``) random edge split with negatives makes it a link-prediction
    store ranked by ``link_metric`` (storage.link_split).
    normalize_features: divide each vertex's features by their L1 norm (storage.features.l1_rows).
    largest_component: keep only the largest connected component (storage.components).
    random_splits: replace the graph's split with this many seeded (``seed``) random splits of ``split_per_class``
    ("TRAIN,VALID") labelled vertices a class, the rest test (storage.random_splits).
    """
    progress = progress or stderr_progress
    if feature_dtype not in FEATURE_DTYPES:
        raise StoreError(f"feature dtype {feature_dtype!r} is not supported. Fix: use one of {FEATURE_DTYPES}")
    if sum(x is not None for x in (from_dir, from_npz, mirror, edges)) > 1:
        raise StoreError("--from-dir, --from-npz, --mirror and --edges exclude each other. Fix: pass only one")
    if self_loops and drop_self_loops:
        raise StoreError("--self-loops and --drop-self-loops contradict each other. Fix: pass only one")
    _check_sizes(nodes, avg_degree, features, classes)
    if any(is_url(where) for where in (out, data_dir) if where is not None):
        raise StoreError(
            f"stores are built in a folder, not at a URL ({out or data_dir}). Fix: build it with --out "
            "FOLDER, then upload the folder (e.g. `aws s3 cp --recursive FOLDER s3://bucket/store`) and "
            "train with --store s3://bucket/store"
        )
    data_dir = _path(data_dir) or default_data_dir().resolve()
    from_dir, from_npz, edges = _path(from_dir), _path(from_npz), _path(edges)
    node_features, labels, splits = _path(node_features), _path(labels), _path(splits)
    argv = ["ntp", "data", "prepare", name]
    info = ogb_info(name)

    if name == "synthetic":
        try:
            spec = SyntheticSpec(
                nodes=10_000 if nodes is None else nodes,
                avg_degree=10.0 if avg_degree is None else avg_degree,
                features=32 if features is None else features,
                classes=8 if classes is None else classes,
                seed=seed,
            )
        except ValueError as e:
            raise StoreError(f"synthetic graph: {e}. Fix: adjust --nodes/--avg-degree/--features/--classes") from None
        identity: dict[str, Any] = {"kind": "synthetic", **asdict(spec)}
        argv += [
            "--nodes",
            str(spec.nodes),
            "--avg-degree",
            str(spec.avg_degree),
            "--features",
            str(spec.features),
            "--classes",
            str(spec.classes),
            "--seed",
            str(spec.seed),
        ]
        make_source: Callable[[], GraphSource] = lambda: synthetic_source(spec)
    elif from_npz is not None:
        digests = Digests(progress)
        identity = {"kind": "heterophilous-npz", "name": name, "file": _file_id(from_npz, digests)}
        digests.save()
        argv += ["--from-npz", str(from_npz)]
        make_source = lambda: heterophilous_source(from_npz, name)
    elif edges is not None or name == "edgelist":
        if edges is None:
            raise StoreError(
                "the edgelist source needs an edge file. Fix: pass --edges FILE (Parquet or CSV "
                "with src,dst[,weight] columns)"
            )
        digests = Digests(progress)
        identity = {
            "kind": "edgelist",
            "edges": _file_id(edges, digests),
            "node_features": _file_id(node_features, digests),
            "labels": _file_id(labels, digests),
            "splits": _file_id(splits, digests),
            "nodes": nodes,
            "classes": classes,
        }
        digests.save()
        for flag, value in (
            ("--edges", edges),
            ("--node-features", node_features),
            ("--labels", labels),
            ("--splits", splits),
            ("--nodes", nodes),
            ("--classes", classes),
        ):
            argv += [flag, str(value)] if value is not None else []
        make_source = lambda: edgelist_source(name, edges, node_features, labels, splits, nodes, classes)
    elif from_dir is not None:
        if not from_dir.is_dir():
            raise StoreError(f"--from-dir {from_dir} is not a directory. Fix: pass an unzipped OGB dataset folder")
        digests = Digests(progress)
        identity = {
            "kind": "ogb-layout",
            "name": name,
            "path": str(from_dir),
            "files": tree_identity(from_dir, ("raw", "split"), digests),
        }
        digests.save()
        argv += ["--from-dir", str(from_dir)]
        make_source = lambda: _folder_source(from_dir, name, info, add_reverse)
    elif info is not None:
        identity = {"kind": "ogb", "name": name, "release": info.version}
        argv += ["--data-dir", str(data_dir)] + (["--mirror", mirror] if mirror else [])
        make_source = lambda: _folder_source(
            fetch_ogb(info, raw_dir(data_dir), mirror, progress), name, info, add_reverse
        )
    else:
        known = ", ".join(sorted(ogb_table()))
        raise StoreError(
            f"unknown dataset {name!r} (OGB lists: {known}). Fix: pass --from-dir DIR for an "
            "OGB-layout folder, --edges FILE for your own graph, or use 'synthetic'"
        )

    hetero = bool(info and info.is_hetero) or (from_dir is not None and is_hetero_folder(from_dir))
    if add_reverse and not hetero:
        raise StoreError(
            f"--add-reverse adds reverse relations to a heterogeneous graph; {name} is homogeneous. "
            "Fix: drop --add-reverse (--symmetrize adds reverse edges to a homogeneous graph)"
        )
    if largest_component:
        whole = make_source
        make_source = lambda: with_largest_component(whole())
    if normalize_features:
        if hetero:
            raise StoreError(
                f"--normalize-features is for homogeneous graphs; {name} is heterogeneous. "
                "Fix: drop --normalize-features"
            )
        raw_source = make_source
        make_source = lambda: with_normalized_features(raw_source())
    # OGB's undirected datasets and the heterophilous files list each edge once: the models run on both directions
    inverse = bool(info and info.add_inverse_edge and edges is None and name != "synthetic" and not hetero)
    inverse = inverse or from_npz is not None
    prep = Preprocessing(
        symmetrize=symmetrize or inverse, self_loops=self_loops, dedup=dedup, drop_self_loops=drop_self_loops
    )
    options = {**prep.to_dict(), "feature_dtype": feature_dtype}
    flags = {
        "add_reverse": add_reverse,
        "normalize_features": normalize_features,
        "largest_component": largest_component,
    }
    options |= {flag: True for flag, on in flags.items() if on}  # only when set: older stores keep their keys
    if random_splits is not None:
        if link_split is not None:
            raise StoreError(
                "--random-splits splits the nodes of a node-classification graph; --link-split makes a "
                "link-prediction store. Fix: pass only one"
            )
        per_class, unsplit = checked_options(random_splits, split_per_class), make_source
        options["random_splits"] = {"sets": random_splits, "per_class": list(per_class), "seed": seed}
        argv += ["--random-splits", str(random_splits), "--split-per-class", split_per_class]
        make_source = lambda: with_random_splits(unsplit(), random_splits, per_class, seed)
    if link_split is not None:
        ratios, inner = parse_ratios(link_split), make_source
        options["link_split"] = {"ratios": list(ratios), "seed": seed, "metric": link_metric}
        argv += ["--link-split", link_split, "--link-metric", link_metric]
        make_source = lambda: _link_split_of(inner(), ratios, seed, link_metric, prep.symmetrize)
    if (random_splits is not None or link_split is not None) and "--seed" not in argv:
        argv += ["--seed", str(seed)]  # the seed draws the splits: the rebuild command repeats it
    digest = options_digest(identity, options)
    target = _path(out) or default_store_path(data_dir, name, digest)
    for flag, on in (
        ("--add-reverse", add_reverse),
        ("--normalize-features", normalize_features),
        ("--largest-component", largest_component),
        ("--symmetrize", symmetrize),
        ("--self-loops", self_loops),
        ("--dedup", dedup),
        ("--drop-self-loops", drop_self_loops),
    ):
        argv += [flag] if on else []
    if feature_dtype != "float32":
        argv += ["--feature-dtype", feature_dtype]
    argv += ["--out", str(target), "--force"]
    return build(
        make_source,
        target,
        prep=prep,
        feature_dtype=feature_dtype,
        build_key=digest,
        rebuild_command=shlex.join(argv),
        progress=progress,
        force=force,
        layout=layout,
    )


def _folder_source(root: Path, name: str, info: Any, add_reverse: bool) -> GraphSource:
    """An OGB folder's source: the heterogeneous layout (raw/num-node-dict.csv.gz) or a homogeneous one."""
    if is_hetero_folder(root):
        return ogb_hetero_source(root, name, info, add_reverse)
    if info is not None and info.is_hetero:
        raise StoreError(
            f"{root}: {name} is heterogeneous but raw/num-node-dict.csv.gz is missing. Fix: download "
            "the dataset again (OGB ships it with raw/num-node-dict.csv.gz and raw/relations/)"
        )
    return ogb_layout_source(root, name, info)


def _link_split_of(
    source: GraphSource, ratios: tuple[float, float], seed: int, metric: str, symmetrize: bool
) -> GraphSource:
    if source.task_type == "link":
        raise StoreError(
            f"{source.name} is already a link-prediction dataset with its own edge splits. Fix: drop --link-split"
        )
    return with_link_split(source, ratios, seed, metric, symmetrize)
