"""Recipes (recipes/*.yaml) next to the published figures they reproduce: one row per recipe, ours (mean +- sample
std over its splits or seeds) beside the literature's.

  python bench/recipes.py                          every recipe
  python bench/recipes.py cora-gcn citeseer-gcn    these
  python bench/recipes.py tolokers-gcn --splits 0,1,2 --epochs 50    fewer runs and epochs (a smoke run)

Each recipe is a `ntp train --config` file whose ``recipe:`` block names the store (made with `ntp data prepare`
from ../shared/datasets or $NTP_DATASETS), the target and its source. Each run is one job (``--nproc`` ranks);
tracked in MLflow as one parent per recipe (experiment 'recipes') with a child per split or seed. The table is
saved under bench/out/ and logged to the 'benchmarks' experiment. "met": our mean reaches the target.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import DATASETS, REPO, base_parser, report

RECIPES = REPO / "recipes"


def load(path: Path) -> dict:
    from ntp.options import load_config_file

    return load_config_file(path)


def store(recipe: dict) -> Path:
    from storage import prepare

    how = dict(recipe["prepare"])
    for key in ("from_dir", "from_npz"):
        if key in how:
            how[key] = DATASETS / how[key]
    return prepare(how.pop("name"), **how, progress=lambda line: None)


def _progress(recipe: str, line: str) -> None:
    """One line as each run starts, resumes and ends (its metric, the running mean); the epochs' lines are left out."""
    if line.startswith(("[ntp] run ", "[ntp] resuming ")):
        print(f"{recipe}: {line.removeprefix('[ntp] ')}", flush=True)


def run(path: Path, nproc: int, track: bool, overrides: dict, continue_run: str | None = None) -> dict:
    from ntp.config import TrainConfig
    from ntp.run.repeats import train_repeats
    from ntp.spec import resolve

    recipe = load(path)["recipe"]
    cfg = TrainConfig.from_file(path, store=str(store(recipe)), **overrides)
    spec = resolve(cfg, nproc=nproc, device="cpu" if nproc > 1 else "auto")
    t0 = time.perf_counter()
    summary = train_repeats(
        spec,
        track=track,
        experiment="recipes",
        run_name=path.stem,
        on_line=lambda line: _progress(path.stem, line),
        continue_run=continue_run,
    )
    m, target = summary.metrics(), recipe.get("target")
    return {
        "recipe": path.stem,
        "metric": summary.metric,
        "runs": len(summary.tests),
        "ours": round(100 * m["test_mean"], 2),
        "ours_std": round(100 * m["test_std"], 2),
        "literature": None if target is None else round(100 * target, 2),
        "met": "n/a" if target is None else ("yes" if m["test_mean"] >= target else "no"),
        "source": recipe.get("source", ""),
        "needs": ", ".join(recipe.get("needs", [])),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    p = base_parser(__doc__, quick=False)
    p.add_argument("names", nargs="*", help="recipe names (file stems under recipes/; default: all)")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks per run (default 1; any count trains the same model, up to floating-point rounding)",
    )
    p.add_argument("--epochs", type=int, default=None, help="override every recipe's epochs (smoke runs)")
    p.add_argument("--splits", default=None, help="override the split sets (e.g. 0,1,2)")
    p.add_argument("--seeds", type=int, default=None, help="override the number of seeds")
    p.add_argument("--no-track", action="store_true", help="do not log the runs to MLflow (the table still is)")
    p.add_argument(
        "--continue",
        dest="continue_run",
        metavar="RUN_ID",
        help="take up a stopped recipe's MLflow parent run (one recipe): its finished runs are kept, the one it "
        "stopped in resumes from its checkpoint, the others run",
    )
    p.add_argument(
        "--checkpoint-dir",
        help="each run's checkpoints (every 10 epochs), in a folder of its recipe's MLflow parent run, so that "
        "--continue resumes the run it stopped in (default: checkpoints/ in the data folder, ./data or "
        "$NTP_DATA_DIR; none with --no-track)",
    )
    args = p.parse_args()
    from storage.paths import default_data_dir

    checkpoints = args.checkpoint_dir or (None if args.no_track else str(default_data_dir() / "checkpoints"))
    given = (("epochs", args.epochs), ("splits", args.splits), ("seeds", args.seeds), ("threads", args.threads))
    overrides = {k: v for k, v in given if v}
    paths = [RECIPES / f"{n}.yaml" for n in args.names] or sorted(RECIPES.glob("*.yaml"))
    if args.continue_run and len(paths) != 1:
        p.error("--continue takes up one recipe's run: name that recipe")
    from ntp.errors import Terminated
    from ntp.run.processes import exit_code, sigterm_raises

    try:
        with sigterm_raises():  # `kill` ends the runs KILLED, as `ntp train` does, not left RUNNING
            track, how = not args.no_track, {**overrides, "checkpoint_dir": checkpoints}
            rows = [run(path, args.nproc, track, how, args.continue_run) for path in paths]
    except (KeyboardInterrupt, Terminated) as exc:
        raise SystemExit(exit_code(exc, "" if args.no_track else " and its MLflow runs are KILLED")) from None
    report("recipes", rows, {"nproc": args.nproc, **overrides})


if __name__ == "__main__":
    main()
