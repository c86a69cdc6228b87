"""Shared helpers of the benchmark scripts: graphs, timing, the DGL environment, MLflow logging, tables."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from ntp.run.allocator import TUNABLES as RANK_TUNABLES  # noqa: E402  (after the path)

#: The real graphs: ../shared/datasets beside the checkout, or NTP_DATASETS (bench/on_device.sh sets it).
DATASETS = Path(os.environ.get("NTP_DATASETS", REPO.parent / "shared" / "datasets"))
DGL_VENV = REPO / "bench" / ".dgl-venv"
DGL_PINS = [
    "torch==2.2.1",
    "dgl==2.1.0",
    "numpy<2",
    "torchdata==0.7.1",
    "pandas<2.3",
    "pyyaml",
    "pydantic",
    "packaging",
]
OUT = REPO / "bench" / "out"

#: Synthetic power-law graphs: (nodes, average degree). "big" is ogbn-products scale (~2M vertices, 50M edges).
SYNTHETIC = {"quick": (100_000, 10), "medium": (500_000, 20), "big": (2_000_000, 25)}


# -- graphs ---------------------------------------------------------------------------------------------------------
def data_dir() -> Path:
    from storage.paths import default_data_dir

    return Path(default_data_dir()).resolve()


def synthetic_store(nodes: int, avg_degree: float, features: int = 128, classes: int = 16) -> Path:
    from storage import prepare

    return prepare(
        "synthetic", nodes=nodes, avg_degree=avg_degree, features=features, classes=classes, progress=lambda line: None
    )


def cornell5_store() -> Path:
    """cornell5 (Facebook100) has no labels or features: class = graduation year (attribute 5; 0 = missing, so
    unlabeled), features = one-hot of status, gender, major and dorm (attributes 0, 1, 2, 4), random 60/20/20 split
    of the labeled vertices (seed 0)."""
    from storage import prepare

    work = data_dir() / "bench-inputs" / "cornell5"
    if not (work / "done").exists():
        work.mkdir(parents=True, exist_ok=True)
        d = np.load(DATASETS / "facebook100" / "cornell5.npz")
        ei, attrs = d["edge_index"], d["node_attributes"]
        n = attrs.shape[0]
        _write_edges(work / "edges.parquet", ei[0], ei[1])
        blocks = []
        for col in (0, 1, 2, 4):
            _, inv = np.unique(attrs[:, col], return_inverse=True)
            blocks.append(np.eye(inv.max() + 1, dtype=np.float32)[inv])
        np.save(work / "x.npy", np.concatenate(blocks, axis=1))
        years, y = np.unique(attrs[:, 5], return_inverse=True)
        y = y.astype(np.int64)
        y[attrs[:, 5] == 0] = -1
        if years[0] == 0:
            y[y >= 0] -= 1
        np.save(work / "y.npy", y)
        _random_splits(work / "splits", np.flatnonzero(y >= 0), n)
        (work / "done").write_text("ok")
    return prepare(
        "cornell5",
        edges=work / "edges.parquet",
        node_features=work / "x.npy",
        labels=work / "y.npy",
        splits=work / "splits",
        progress=lambda line: None,
    )


def tolokers_store() -> Path:
    """tolokers (heterophilous-graphs): published features, binary labels and its first published split."""
    from storage import prepare

    work = data_dir() / "bench-inputs" / "tolokers"
    if not (work / "done").exists():
        work.mkdir(parents=True, exist_ok=True)
        d = np.load(DATASETS / "heterophilous" / "tolokers.npz")
        e = d["edges"]
        # published as undirected pairs: store both directions
        _write_edges(work / "edges.parquet", np.concatenate([e[:, 0], e[:, 1]]), np.concatenate([e[:, 1], e[:, 0]]))
        np.save(work / "x.npy", d["node_features"].astype(np.float32))
        np.save(work / "y.npy", d["node_labels"].astype(np.int64))
        (work / "splits").mkdir(exist_ok=True)
        for part, key in (("train", "train_masks"), ("valid", "val_masks"), ("test", "test_masks")):
            np.save(work / "splits" / f"{part}.npy", np.flatnonzero(d[key][0]).astype(np.int64))
        (work / "done").write_text("ok")
    return prepare(
        "tolokers",
        edges=work / "edges.parquet",
        node_features=work / "x.npy",
        labels=work / "y.npy",
        splits=work / "splits",
        progress=lambda line: None,
    )


def _write_edges(path: Path, src: np.ndarray, dst: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"src": np.asarray(src, np.int64), "dst": np.asarray(dst, np.int64)}), path)


def _random_splits(folder: Path, labeled: np.ndarray, n: int, seed: int = 0) -> None:
    folder.mkdir(exist_ok=True)
    perm = np.random.default_rng(seed).permutation(labeled)
    a, b = int(0.6 * len(perm)), int(0.8 * len(perm))
    for part, ids in (("train", perm[:a]), ("valid", perm[a:b]), ("test", perm[b:])):
        np.save(folder / f"{part}.npy", np.sort(ids).astype(np.int64))


def graph_stores(names: Sequence[str], size: str) -> dict[str, Path]:
    """Store path per graph name: 'synthetic' (at ``size``), 'cornell5', 'tolokers'."""
    out = {}
    for name in names:
        if name == "synthetic":
            nodes, deg = SYNTHETIC[size]
            out[f"synthetic-{size}"] = synthetic_store(nodes, deg)
        elif name == "cornell5":
            out[name] = cornell5_store()
        elif name == "tolokers":
            out[name] = tolokers_store()
        else:
            raise SystemExit(f"unknown graph {name!r}; choose from synthetic, cornell5, tolokers")
    return out


def load_arrays(store: Path, feature_width: int | None = None) -> dict[str, Any]:
    """indptr, indices (CSR over in-edges), features (optionally re-drawn at ``feature_width``), labels, train ids."""
    from storage import open_store

    s = open_store(store)
    x = np.asarray(s.features(), np.float32)
    if feature_width:
        x = np.random.default_rng(0).standard_normal((x.shape[0], feature_width), dtype=np.float32)
    y = np.asarray(s.labels())
    return {
        "indptr": np.asarray(s.indptr(), np.int64),
        "indices": np.asarray(s.indices(), np.int64),
        "x": x,
        "y": y,
        "train": np.asarray(s.split("train"), np.int64),
        "classes": s.meta.num_classes,
        "name": s.meta.name,
    }


# -- timing -----------------------------------------------------------------------------------------------------------
def time_median(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def in_process(step: Callable[[], Any]) -> Callable[[int], list[float]]:
    """A turn of ``step``: ``k`` epochs in this process, each one's seconds."""

    def turn(k: int) -> list[float]:
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return times

    return turn


def alternating_turns(
    systems: dict[str, Callable[[int], list[float]]], warmup: int, turns: int, per_turn: int, settle: float = 0.2
) -> dict[str, float]:
    """Every system timed the same way: ``warmup`` untimed epochs each, then ``turns`` turns of ``per_turn``
    epochs each, the order rotating by one system a turn (a shared machine drifts; no system always goes first);
    per system the median over turns of the turn's median epoch. ``settle`` seconds pass before each turn, so the
    previous system's OpenMP threads stop spinning (DGL's live in another process) before the next one's clock."""
    names = list(systems)
    for name in names:
        if warmup:
            systems[name](warmup)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for t in range(turns):
        for name in names[t % len(names) :] + names[: t % len(names)]:
            time.sleep(settle)
            medians[name].append(statistics.median(systems[name](per_turn)))
    return {name: statistics.median(m) for name, m in medians.items()}


@contextlib.contextmanager
def torch_ops_dropout():
    """ntp's CPU dropout without its C kernel (NTP_NATIVE=0): the masks drawn, then applied by torch's ops."""
    from ntp.engine.kernels import native

    before = os.environ.get("NTP_NATIVE")
    os.environ["NTP_NATIVE"] = "0"
    native.library.cache_clear()
    try:
        yield
    finally:
        os.environ.pop("NTP_NATIVE")
        os.environ.update({} if before is None else {"NTP_NATIVE": before})
        native.library.cache_clear()
        native.library()  # loaded again here, not inside the next timed call


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }


# -- DGL in its own environment -----------------------------------------------------------------------------------------
def dgl_python(build: bool) -> tuple[Path | None, str]:
    """The python of the DGL environment (built on demand when ``build``), or None and the reason."""
    py = DGL_VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import dgl"], capture_output=True).returncode == 0:
        return py, "ok"
    if not build:
        return None, f"DGL environment not built ({DGL_VENV}); pass --with-dgl to build it"
    print(
        f"building the DGL environment in {DGL_VENV} (about 5 GB, a few minutes): {' '.join(DGL_PINS)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        subprocess.run([sys.executable, "-m", "venv", str(DGL_VENV)], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *DGL_PINS], check=True)
        subprocess.run([py, "-c", "import dgl"], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return None, f"could not build the DGL environment ({exc}); DGL columns are left empty"
    return py, "ok"


def run_dgl(py: Path, script: str, payload: dict) -> dict | None:
    """Run ``bench/<script>`` in the DGL environment with a JSON payload; returns its JSON answer (on failure None,
    or with ``payload["errors_to_note"]`` a row whose note is the error's last line)."""
    res = subprocess.run([str(py), str(REPO / "bench" / script), json.dumps(payload)], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"DGL run failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        last = (res.stderr.strip().splitlines() or ["no error output"])[-1]
        return {"note": f"DGL failed: {last[:160]}"} if payload.get("errors_to_note") else None
    return json.loads(res.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def dgl_server(py: Path, script: str, payload: dict, timeout: float = 900.0):
    """``bench/<script>`` in the DGL environment as one long-lived process that builds its job once, then runs
    ``k`` epochs for each ``k`` sent to it: yields a turn function, as :func:`in_process` gives for this process."""
    import selectors

    proc = subprocess.Popen(
        [str(py), str(REPO / "bench" / script), json.dumps({**payload, "serve": True})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)

    def answer() -> Any:
        if not sel.select(timeout):
            raise TimeoutError(f"DGL's worker gave no answer in {timeout:.0f} s")
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"DGL's worker ended (exit {proc.wait(timeout=10)}); its error is above")
        return json.loads(line)

    def turn(k: int) -> list[float]:
        proc.stdin.write(f"{k}\n")
        proc.stdin.flush()
        return answer()["times"]

    try:
        answer()  # ready: the graph and the model are built
        yield turn
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- output -------------------------------------------------------------------------------------------------------------
def table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """A markdown table of ``rows`` (default columns: every key of any row, in the order they first appear)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report(name: str, rows: list[dict], params: dict, columns: Sequence[str] | None = None) -> str:
    """Print the table, save rows as JSON under bench/out/, and log both to the MLflow experiment 'benchmarks'."""
    text = table(rows, columns)
    print(text, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    out_json = OUT / f"{name}.json"
    out_md = OUT / f"{name}.md"
    out_json.write_text(json.dumps({"params": params, "machine": machine(), "rows": rows}, indent=1, default=str))
    out_md.write_text(text + "\n")
    try:
        _log_mlflow(name, rows, params, [out_json, out_md])
    except Exception as exc:  # the table is the result; tracking is a convenience
        print(f"warning: could not log to MLflow: {exc}", file=sys.stderr)
    return text


def _log_mlflow(name: str, rows: list[dict], params: dict, files: list[Path]) -> None:
    from ntp.run import tracking

    client = tracking.client()
    exp = tracking.experiment_id("benchmarks", client)
    run = client.create_run(exp, run_name=name, tags={"benchmark": name, "git_commit": tracking.git_commit(REPO) or ""})
    rid = run.info.run_id
    for k, v in {**params, **{f"machine.{k}": v for k, v in machine().items()}}.items():
        client.log_param(rid, k, str(v)[:500])
    for i, row in enumerate(rows):
        label = "_".join(str(v) for k, v in row.items() if isinstance(v, str) and not k.startswith("repeat"))[:200]
        for k, v in row.items():
            if isinstance(v, (int, float)) and v == v and not isinstance(v, bool):
                key = re.sub(r"[^A-Za-z0-9_.:-]", "", f"{label}.{k}".replace(" ", "_").replace("/", "_per_"))
                client.log_metric(rid, key, float(v), step=i)
    for f in files:
        client.log_artifact(rid, str(f))
    client.set_terminated(rid)


def base_parser(doc: str, *, quick: bool = True, repeats: bool = False, threads: bool = True):
    """A script's parser with the shared options it honours: --quick (a smoke run), --repeats (it times something
    several times and reports the median), --threads (it runs torch here)."""
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick:
        p.add_argument("--quick", action="store_true", help="small sizes and few repeats (runs in about a minute)")
    if repeats:
        p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (median reported)")
    if threads:
        p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    return p


def add_single_process_arguments(p) -> None:
    """--with-dgl and --allocator, which :func:`single_process_settings` reads."""
    p.add_argument("--with-dgl", action="store_true", help="build the DGL environment if needed and time DGL too")
    p.add_argument(
        "--allocator",
        choices=list(ALLOCATORS),
        default="hugepages",
        help="every contender's large blocks in transparent huge pages, as ntp's ranks get them "
        "(hugepages), or glibc's defaults (default: hugepages)",
    )


def add_graph_arguments(p) -> None:
    """--graphs and --size, which :func:`graph_selection` reads."""
    p.add_argument("--graphs", nargs="+", default=None, help="synthetic, cornell5, tolokers")
    p.add_argument("--size", default=None, choices=["quick", "medium", "big"], help="synthetic graph size")


def graph_selection(args, full_size: str) -> tuple[str, list[str]]:
    """(size, graph names) from --size/--graphs: --quick means the small synthetic graph only."""
    size = args.size or ("quick" if args.quick else full_size)
    graphs = args.graphs or (["synthetic"] if args.quick else ["synthetic", "cornell5", "tolokers"])
    return size, graphs


#: --allocator: glibc's tunables of every contender's process
ALLOCATORS = {"hugepages": RANK_TUNABLES, "default": "glibc.malloc.hugetlb=0"}


def same_allocator(mode: str) -> None:
    """Every contender allocates the same way: ``hugepages`` as ntp's ranks do (ntp.run.allocator), ``default`` as
    glibc does. Tunables are read at start-up, so this process (ntp in one process, PyG) restarts itself with them
    once; DGL's process inherits them."""
    wanted = ALLOCATORS[mode]
    if os.environ.get("GLIBC_TUNABLES") != wanted:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "GLIBC_TUNABLES": wanted})


def single_process_settings(args) -> tuple[int, int, Path | None, str]:
    """(repeats, threads, DGL's python or None, a note on DGL) for the single-process benchmarks; sets torch's
    thread count and the allocator of every contender (--allocator)."""
    import torch

    same_allocator(args.allocator)

    repeats = args.repeats or (3 if args.quick else 5)
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    dgl_py, dgl_note = dgl_python(args.with_dgl) if args.with_dgl else (None, "not requested (--with-dgl)")
    if dgl_py is None:
        print(f"DGL: {dgl_note}")
    return repeats, threads, dgl_py, dgl_note


def real_store(name: str) -> Path:
    """The real graph ``name`` of ../shared/datasets (OGB layout), symmetrised, as a store (built once)."""
    from storage import prepare

    return prepare(
        name,
        from_dir=DATASETS / "ogb-layout" / name,
        symmetrize=True,
        progress=lambda line: None,
        out=data_dir() / "bench-inputs" / f"{name}-sym",
    )
