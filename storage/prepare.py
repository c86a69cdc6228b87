"""prepare(): turn a dataset name plus options into a built store path (idempotent)."""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
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
    _check_options(feature_dtype, (from_dir, from_npz, mirror, edges), self_loops, drop_self_loops, out, data_dir)
    _check_sizes(nodes, avg_degree, features, classes)
    data_dir = _path(data_dir) or default_data_dir().resolve()
    from_dir, from_npz, edges = _path(from_dir), _path(from_npz), _path(edges)
    info = ogb_info(name)
    if name == "synthetic":
        origin = _synthetic(nodes, avg_degree, features, classes, seed)
    elif from_npz is not None:
        origin = _npz(name, from_npz, progress)
    elif edges is not None or name == "edgelist":
        table = dict(edges=edges, node_features=node_features, labels=labels, splits=splits)
        origin = _edgelist(name, {flag: _path(p) for flag, p in table.items()}, nodes, classes, progress)
    elif from_dir is not None:
        origin = _folder(name, from_dir, info, add_reverse, progress)
    elif info is not None:
        origin = _download(name, info, data_dir, mirror, add_reverse, progress)
    else:
        known = ", ".join(sorted(ogb_table()))
        raise StoreError(
            f"unknown dataset {name!r} (OGB lists: {known}). Fix: pass --from-dir DIR for an "
            "OGB-layout folder, --edges FILE for your own graph, or use 'synthetic'"
        )

    hetero = bool(info and info.is_hetero) or (from_dir is not None and is_hetero_folder(from_dir))
    _check_kind(name, hetero, add_reverse, normalize_features)
    # OGB's undirected datasets and the heterophilous files list each edge once: the models run on both directions
    inverse = bool(info and info.add_inverse_edge and edges is None and name != "synthetic" and not hetero)
    inverse = inverse or from_npz is not None
    prep = Preprocessing(
        symmetrize=symmetrize or inverse, self_loops=self_loops, dedup=dedup, drop_self_loops=drop_self_loops
    )
    flags = {
        "add_reverse": add_reverse,
        "normalize_features": normalize_features,
        "largest_component": largest_component,
    }
    options = {**prep.to_dict(), "feature_dtype": feature_dtype}
    options |= {flag: True for flag, on in flags.items() if on}  # only when set: older stores keep their keys
    read = _transformed(origin.read, largest_component, normalize_features)
    read = _resplit(read, options, origin.argv, prep, seed, random_splits, split_per_class, link_split, link_metric)
    digest = options_digest(origin.identity, options)
    target = _path(out) or default_store_path(data_dir, name, digest)
    switches = {**flags, "symmetrize": symmetrize, "self_loops": self_loops, "dedup": dedup}
    switches |= {"drop_self_loops": drop_self_loops}
    argv = ["ntp", "data", "prepare", name, *origin.argv, *(_flag(key) for key, on in switches.items() if on)]
    argv += ["--feature-dtype", feature_dtype] if feature_dtype != "float32" else []
    return build(
        read,
        target,
        prep=prep,
        feature_dtype=feature_dtype,
        build_key=digest,
        rebuild_command=shlex.join([*argv, "--out", str(target), "--force"]),
        progress=progress,
        force=force,
        layout=layout,
    )


@dataclass
class _Origin:
    """Where a graph comes from: what identifies its bytes (the store's path hashes it), the flags that name it
    again (the store's rebuild command), and how to read it."""

    identity: dict[str, Any]
    argv: list[str]
    read: Callable[[], GraphSource]


def _check_options(
    feature_dtype: str, sources: tuple, self_loops: bool, drop_self_loops: bool, out: PathLike, data_dir: PathLike
) -> None:
    if feature_dtype not in FEATURE_DTYPES:
        raise StoreError(f"feature dtype {feature_dtype!r} is not supported. Fix: use one of {FEATURE_DTYPES}")
    if sum(x is not None for x in sources) > 1:
        raise StoreError("--from-dir, --from-npz, --mirror and --edges exclude each other. Fix: pass only one")
    if self_loops and drop_self_loops:
        raise StoreError("--self-loops and --drop-self-loops contradict each other. Fix: pass only one")
    if any(is_url(where) for where in (out, data_dir) if where is not None):
        raise StoreError(
            f"stores are built in a folder, not at a URL ({out or data_dir}). Fix: build it with --out "
            "FOLDER, then upload the folder (e.g. `aws s3 cp --recursive FOLDER s3://bucket/store`) and "
            "train with --store s3://bucket/store"
        )


def _check_kind(name: str, hetero: bool, add_reverse: bool, normalize_features: bool) -> None:
    if add_reverse and not hetero:
        raise StoreError(
            f"--add-reverse adds reverse relations to a heterogeneous graph; {name} is homogeneous. "
            "Fix: drop --add-reverse (--symmetrize adds reverse edges to a homogeneous graph)"
        )
    if normalize_features and hetero:
        raise StoreError(
            f"--normalize-features is for homogeneous graphs; {name} is heterogeneous. Fix: drop --normalize-features"
        )


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _synthetic(
    nodes: int | None, avg_degree: float | None, features: int | None, classes: int | None, seed: int
) -> _Origin:
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
    sizes = {"nodes": spec.nodes, "avg_degree": spec.avg_degree, "features": spec.features, "classes": spec.classes}
    argv = [arg for key, value in {**sizes, "seed": spec.seed}.items() for arg in (_flag(key), str(value))]
    return _Origin({"kind": "synthetic", **asdict(spec)}, argv, lambda: synthetic_source(spec))


def _npz(name: str, path: Path, progress: Callable[[str], None]) -> _Origin:
    digests = Digests(progress)
    identity = {"kind": "heterophilous-npz", "name": name, "file": _file_id(path, digests)}
    digests.save()
    return _Origin(identity, ["--from-npz", str(path)], lambda: heterophilous_source(path, name))


def _edgelist(
    name: str, files: dict[str, Path | None], nodes: int | None, classes: int | None, progress: Callable[[str], None]
) -> _Origin:
    """``files``: the edges, node features, labels and splits, by their flags' names."""
    if files["edges"] is None:
        raise StoreError(
            "the edgelist source needs an edge file. Fix: pass --edges FILE (Parquet or CSV "
            "with src,dst[,weight] columns)"
        )
    digests = Digests(progress)
    identity = {"kind": "edgelist", **{key: _file_id(p, digests) for key, p in files.items()}}
    identity |= {"nodes": nodes, "classes": classes}
    digests.save()
    given = {**files, "nodes": nodes, "classes": classes}
    argv = [arg for key, value in given.items() if value is not None for arg in (_flag(key), str(value))]
    return _Origin(identity, argv, lambda: edgelist_source(name, *files.values(), nodes, classes))


def _folder(name: str, root: Path, info: Any, add_reverse: bool, progress: Callable[[str], None]) -> _Origin:
    if not root.is_dir():
        raise StoreError(f"--from-dir {root} is not a directory. Fix: pass an unzipped OGB dataset folder")
    digests = Digests(progress)
    files = tree_identity(root, ("raw", "split"), digests)
    digests.save()
    identity = {"kind": "ogb-layout", "name": name, "path": str(root), "files": files}
    return _Origin(identity, ["--from-dir", str(root)], lambda: _folder_source(root, name, info, add_reverse))


def _download(
    name: str, info: Any, data_dir: Path, mirror: str | None, add_reverse: bool, progress: Callable[[str], None]
) -> _Origin:
    argv = ["--data-dir", str(data_dir)] + (["--mirror", mirror] if mirror else [])
    fetch = lambda: fetch_ogb(info, raw_dir(data_dir), mirror, progress)  # noqa: E731
    identity = {"kind": "ogb", "name": name, "release": info.version}
    return _Origin(identity, argv, lambda: _folder_source(fetch(), name, info, add_reverse))


def _transformed(
    read: Callable[[], GraphSource], largest_component: bool, normalize_features: bool
) -> Callable[[], GraphSource]:
    """``read`` with the vertices cut to the largest component, then the features normalised, where asked."""
    if largest_component:
        whole = read
        read = lambda: with_largest_component(whole())  # noqa: E731
    if normalize_features:
        raw = read
        read = lambda: with_normalized_features(raw())  # noqa: E731
    return read


def _resplit(
    read: Callable[[], GraphSource],
    options: dict[str, Any],
    argv: list[str],
    prep: Preprocessing,
    seed: int,
    random_splits: int | None,
    split_per_class: str,
    link_split: str | None,
    link_metric: str,
) -> Callable[[], GraphSource]:
    """``read`` with the graph's split replaced by seeded random node splits or a random edge split, where asked;
    each adds its options (the store's path) and flags (its rebuild command)."""
    if random_splits is not None and link_split is not None:
        raise StoreError(
            "--random-splits splits the nodes of a node-classification graph; --link-split makes a "
            "link-prediction store. Fix: pass only one"
        )
    if random_splits is not None:
        per_class, unsplit = checked_options(random_splits, split_per_class), read
        options["random_splits"] = {"sets": random_splits, "per_class": list(per_class), "seed": seed}
        argv += ["--random-splits", str(random_splits), "--split-per-class", split_per_class]
        read = lambda: with_random_splits(unsplit(), random_splits, per_class, seed)  # noqa: E731
    if link_split is not None:
        ratios, whole = parse_ratios(link_split), read
        options["link_split"] = {"ratios": list(ratios), "seed": seed, "metric": link_metric}
        argv += ["--link-split", link_split, "--link-metric", link_metric]
        read = lambda: _link_split_of(whole(), ratios, seed, link_metric, prep.symmetrize)  # noqa: E731
    if (random_splits is not None or link_split is not None) and "--seed" not in argv:
        argv += ["--seed", str(seed)]  # the seed draws the splits: the rebuild command repeats it
    return read


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
