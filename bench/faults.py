"""The fault-injection matrix: every fault and bad input of the reliability review, run for real, as a table.

Each case is one or more tests that inject the fault (a real signal to a real process tree, real concurrent
processes on a real sqlite file, a real directory that must survive, a damaged file) and check what an operator
expects. This script runs exactly those tests with pytest and prints: case, expected, observed, held. A case holds
only if every one of its tests (every parametrised instance) ran and passed; a skipped one is listed as "not run
here, because ..." and the case does not hold. Usage:

    python bench/faults.py                # the whole matrix (several minutes)
    python bench/faults.py -k resume      # only the cases whose description or tests contain "resume"
    python bench/faults.py --write-docs   # the whole matrix, written into docs/reliability.md with the commit

Exit status 1 when a case failed or has no result; run from a checkout with ../shared/datasets beside it (the
tests that need those graphs skip elsewhere, and their cases then do not hold).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import platform
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from common import REPO, report

DOC = REPO / "docs" / "reliability.md"
BEGIN, END = "<!-- bench/faults.py writes from here -->", "<!-- to here -->"
COLUMNS = ["severity", "case", "expected", "observed", "held"]

PF = "tests/pipeline/test_process_faults.py"
OWN = "tests/storage/test_store_ownership.py"
INPUTS = "tests/storage/test_store_inputs.py"
CORRUPT = "tests/storage/test_store_corrupt.py"
FAULTS = "tests/ntp/test_faults.py"


@dataclass(frozen=True)
class Case:
    severity: str
    case: str
    expected: str
    tests: tuple[str, ...]  # pytest node ids ``file::function``; every parametrised instance of each belongs here


CASES = [
    Case(
        "high",
        "SIGTERM to the `ntp train` launcher",
        "job stopped < 15 s, no process left, MLflow run KILLED",
        (f"{PF}::test_sigterm_to_the_launcher_stops_the_job_and_ends_the_run_killed",),
    ),
    Case(
        "high",
        "SIGKILL to the `ntp train` launcher",
        "torchrun and workers die with it; the next run closes its MLflow run KILLED and the next command removes its "
        "temporary folders (job scratch, compile cache; this host's only)",
        (
            f"{PF}::test_sigkill_to_the_launcher_leaves_no_worker_and_the_next_run_closes_its_run",
            f"{PF}::test_the_scratch_sweep_keeps_other_hosts_folders_and_running_launchers",
        ),
    ),
    Case(
        "high",
        "4 first runs at once on a fresh MLflow sqlite store",
        "all succeed, database intact",
        (f"{PF}::test_concurrent_first_runs_share_a_fresh_sqlite_store",),
    ),
    Case(
        "high",
        "`ntp data prepare --out DIR` on an unrelated Zarr group or directory",
        "refused with the fix, with or without --force; nothing deleted",
        (f"{OWN}::test_foreign_zarr_group_is_never_replaced",),
    ),
    Case(
        "high",
        "same, through the `ntp data` CLI",
        "exit 2, the user's files intact",
        (f"{OWN}::test_cli_refuses_a_foreign_zarr_group",),
    ),
    Case(
        "medium",
        "Ctrl-C / SIGTERM to `ntp pipeline` mid-training",
        "exits < 30 s; no Prefect server, torchrun or worker left",
        (f"{PF}::test_stopping_ntp_pipeline_is_quick_and_leaves_no_server_or_worker",),
    ),
    Case(
        "medium",
        "a job ending on a busy machine",
        "every rank exits 0; no gloo thread outlives the job",
        ("tests/ntp/test_dist.py::test_leaving_the_job_stops_gloos_threads_before_the_interpreter_exits",),
    ),
    Case(
        "medium",
        "--resume with a changed option",
        "refused before any rank starts, each change listed, --resume-anyway named",
        (f"{FAULTS}::test_resume_refuses_a_changed_option_before_and_inside_the_rank",),
    ),
    Case(
        "medium",
        "--resume on another store",
        "refused unless --resume-anyway",
        (f"{FAULTS}::test_resume_refuses_another_store_unless_told",),
    ),
    Case(
        "medium",
        "a new run in a --checkpoint-dir holding an earlier run's checkpoints",
        "refused before any rank starts, --resume named; their checkpoints would be mixed",
        (f"{FAULTS}::test_a_new_run_is_refused_a_checkpoint_folder_holding_an_earlier_runs",),
    ),
    Case(
        "medium",
        "`ntp train --seeds N` stopped mid-job, then `--continue`",
        "finished jobs kept, the stopped one resumed from its checkpoint, the summary of an unstopped run",
        (
            "tests/ntp/test_repeats.py::test_a_stopped_run_continues_under_its_parent_keeping_its_finished_children",
            "tests/ntp/test_repeats.py::test_continue_resumes_the_stopped_job_from_its_checkpoint",
        ),
    ),
    Case(
        "medium",
        "an input edited without changing its size (OGB folder, edge list)",
        "the store is rebuilt, not reused",
        (
            f"{INPUTS}::test_same_size_edit_of_an_ogb_folder_rebuilds",
            f"{INPUTS}::test_same_size_edit_of_an_edgelist_rebuilds",
        ),
    ),
    Case(
        "medium",
        "labels out of range, fractional or below -1 (numpy, parquet, OGB folder)",
        "refused, naming the vertex and the value",
        tuple(
            f"tests/storage/test_store_labels.py::{name}"
            for name in (
                "test_float_label_with_a_fraction_is_refused",
                "test_huge_label_is_refused",
                "test_label_beyond_the_given_classes_is_refused",
                "test_label_below_minus_one_is_refused",
                "test_parquet_labels_are_checked_too",
                "test_ogb_folder_labels_are_checked",
                "test_ogb_metadata_bounds_the_labels",
            )
        ),
    ),
    Case(
        "medium",
        "a synthetic graph that cannot fit; --nodes 0 and other sizes below 1",
        "refused up front with the numbers",
        (
            "tests/storage/test_store_resources.py::test_non_positive_sizes_are_errors",
            "tests/storage/test_store_resources.py::test_edgelist_nodes_zero_is_an_error",
            "tests/storage/test_store_resources.py::test_graph_that_cannot_fit_is_refused_up_front",
        ),
    ),
    Case(
        "medium",
        "--job-timeout",
        "every worker gone when the launcher returns",
        ("tests/ntp/test_training.py::test_job_timeout_kills_every_worker",),
    ),
    Case(
        "low",
        "truncated gzip / npy, a folder as a file, a file as a directory, an unreadable file",
        "a StoreError naming the file and the fix",
        (
            f"{INPUTS}::test_truncated_gzip_names_the_file",
            f"{INPUTS}::test_truncated_npy_features_name_the_file",
            f"{INPUTS}::test_a_folder_given_as_edge_file",
            f"{INPUTS}::test_out_below_a_file_is_a_store_error",
            f"{INPUTS}::test_unreadable_input_names_permissions",
        ),
    ),
    Case(
        "low",
        "a build or download killed with SIGKILL",
        "its temporary directory is swept by the next build; look-alikes and live builds are left alone",
        (
            f"{OWN}::test_killed_rebuild_is_swept_when_the_store_is_reused",
            f"{OWN}::test_killed_build_is_swept_by_a_build_beside_it",
            f"{OWN}::test_live_builds_and_lookalikes_are_left_alone",
        ),
    ),
    Case(
        "low",
        "a killed download",
        "nothing left behind",
        ("tests/storage/test_store_download.py::test_killed_download_leaves_nothing_behind",),
    ),
    Case(
        "low",
        "a damaged store: missing array, chunk or metadata, truncated or corrupt chunk, wrong schema, counts that "
        "disagree, not a directory",
        "a StoreError naming the store, what is damaged and the rebuild command",
        tuple(
            f"{CORRUPT}::{name}"
            for name in (
                "test_missing_array",
                "test_missing_chunk",
                "test_truncated_chunk",
                "test_corrupt_chunk_bytes",
                "test_wrong_schema_version",
                "test_missing_metadata_field",
                "test_mismatched_counts",
                "test_no_metadata_at_all",
                "test_not_a_directory",
            )
        ),
    ),
    Case(
        "low",
        "`ntp data info --verify` after editing num_classes",
        "the mismatch is reported with the rebuild command",
        (
            f"{CORRUPT}::test_verify_recomputes_num_classes",
            f"{CORRUPT}::test_info_verify_reports_an_edited_num_classes",
        ),
    ),
    Case(
        "low",
        "a zarr.json holding a list, null, a number, or one zarr rejects",
        "a StoreError naming the file",
        (f"{CORRUPT}::test_zarr_json_that_is_not_an_object", f"{CORRUPT}::test_zarr_json_that_zarr_rejects"),
    ),
    Case(
        "low",
        "damaged latest checkpoint",
        "the previous good one is resumed, with a warning",
        (f"{FAULTS}::test_damaged_latest_checkpoint_is_skipped_for_the_previous_one",),
    ),
    Case(
        "low",
        "no loadable checkpoint",
        "a clear error naming each file",
        (f"{FAULTS}::test_no_loadable_checkpoint_is_a_clear_error",),
    ),
    Case(
        "low",
        "`ntp evaluate` on another store",
        "refused, both fingerprints named, --any-store",
        (f"{FAULTS}::test_evaluate_refuses_a_model_of_another_store",),
    ),
    Case(
        "low",
        "no labelled training vertex (GAT and others)",
        "one clear error before training, every model and mode",
        (f"{FAULTS}::test_graph_without_training_labels_is_refused_for_every_model",),
    ),
    Case(
        "low",
        "--model-out DIR, --results DIR, --checkpoint-dir FILE",
        "refused before training",
        (f"{FAULTS}::test_unwritable_output_path_is_refused_before_training",),
    ),
    Case(
        "low",
        "a rank killed by a signal (no traceback)",
        "that rank is blamed, with torchrun's root cause; the peers torchrun stopped are not",
        (
            f"{PF}::test_a_rank_killed_by_a_signal_is_the_one_blamed",
            f"{PF}::test_a_rank_torchrun_stopped_is_not_blamed_for_one_killed_outright",
        ),
    ),
    Case(
        "low",
        "experiment name `..`",
        "artifacts stay inside the tracking directory",
        (f"{PF}::test_an_experiment_name_cannot_escape_the_artifact_directory",),
    ),
    Case(
        "low",
        "--nproc 0, --nnodes 0, more ranks than GPUs",
        "a clear error with the fix",
        ("tests/ntp/test_spec.py::test_contradictory_launches_are_refused_with_the_fix",),
    ),
]


def check_cases(cases: list[Case], repo: Path = REPO) -> None:
    """Every case names at least one test, each test exists as a top-level test function of its file, and no test
    belongs to two cases; otherwise a ValueError naming the case and the test."""
    seen: dict[str, str] = {}
    functions: dict[str, set[str]] = {}
    for c in cases:
        if not c.tests:
            raise ValueError(f"fault case {c.case!r} has no test: add the test that injects it to its Case.tests")
        for node in c.tests:
            file, _, name = node.partition("::")
            if file not in functions:
                path = repo / file
                if not path.is_file():
                    raise ValueError(f"fault case {c.case!r}: no test file {file}")
                tree = ast.parse(path.read_text())
                functions[file] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if not name.startswith("test_") or name not in functions[file]:
                raise ValueError(f"fault case {c.case!r}: {file} has no test function {name!r}")
            if node in seen:
                raise ValueError(f"{node} belongs to two fault cases: {seen[node]!r} and {c.case!r}")
            seen[node] = c.case


def select(cases: list[Case], word: str) -> list[Case]:
    """The cases whose description or test names contain ``word`` (all of them for "")."""
    return [c for c in cases if word in c.case or any(word in t for t in c.tests)]


def node_of(result: str) -> str:
    """``file::function`` of a result's node id ``file::function[parameters]``."""
    return result.split("[", 1)[0]


def run_tests(nodes: list[str]) -> dict[str, tuple[str, str]]:
    """Run exactly ``nodes`` with pytest; node id with its parameters -> (outcome, message)."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "faults.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *nodes]
        subprocess.run(cmd, cwd=REPO, check=False)
        root = ET.parse(xml).getroot()
    results: dict[str, tuple[str, str]] = {}
    for case in root.iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if problem is None else problem.tag
        message = "" if problem is None else (problem.get("message") or "").splitlines()[0][:160]
        results[f"{path}::{case.get('name', '')}"] = (outcome, message)
    return results


def row(c: Case, results: dict[str, tuple[str, str]]) -> dict:
    """One line of the matrix: the case holds only if each of its tests has a result and every result passed."""
    mine = {name: r for name, r in results.items() if node_of(name) in c.tests}
    missing = [t.split("::")[1] for t in c.tests if not any(node_of(name) == t for name in mine)]
    failed = [f"{name.split('::')[1]}: {m or o}" for name, (o, m) in mine.items() if o in ("failure", "error")]
    skipped: dict[str, int] = {}  # "function, because reason" -> instances
    for name, (o, m) in mine.items():
        if o == "skipped":
            key = f"{node_of(name).split('::')[1]}, because {m.removeprefix('Skipped: ')}"
            skipped[key] = skipped.get(key, 0) + 1
    notes = [f"FAILED {f}" for f in failed] + [f"no result from {m}" for m in missing]
    notes += [f"not run here ({n}x): {s}" if n > 1 else f"not run here: {s}" for s, n in skipped.items()]
    passed = sum(o == "passed" for o, _ in mine.values())
    held = "NO" if failed or missing else "not shown" if skipped else "yes"
    observed = "; ".join(notes) if notes else "as expected"
    return {
        "severity": c.severity,
        "case": c.case,
        "expected": c.expected,
        "observed": f"{observed} ({passed} of {len(mine)} passed)",
        "held": held,
    }


def commit_named() -> str:
    """HEAD's short hash, with "+ uncommitted changes" when tracked files differ from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")


def write_docs(block: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block to replace")
    head, _, tail = text.partition(BEGIN)
    DOC.write_text(head + BEGIN + "\n" + block + "\n" + tail.partition(END)[1] + tail.partition(END)[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="only the cases whose description or test names contain this")
    parser.add_argument("--write-docs", action="store_true", help=f"replace the matrix in {DOC.relative_to(REPO)}")
    args = parser.parse_args()
    if args.write_docs and args.k:
        parser.error("--write-docs writes the whole matrix: leave out -k")
    check_cases(CASES)
    selected = select(CASES, args.k)
    if not selected:
        parser.error(f"no case matches -k {args.k!r}")
    commit = commit_named()
    results = run_tests([t for c in selected for t in c.tests])
    rows = [row(c, results) for c in selected]
    counts = {o: sum(r[0] == o for r in results.values()) for o in ("passed", "skipped", "failure", "error")}
    today = datetime.date.today().isoformat()
    summary = (
        f"Run of {today} on {platform.node()} ({platform.machine()}, Python {platform.python_version()}), "
        f"commit {commit}, `{shlex.join(['python', 'bench/faults.py', *sys.argv[1:]])}`: {counts['passed']} tests passed, "
        f"{counts['skipped']} skipped, {counts['failure'] + counts['error']} failed."
    )
    text = report("faults", rows, {"date": today, "commit": commit, **counts}, COLUMNS)
    print(summary)
    if args.write_docs:
        write_docs(summary + "\n\n" + text)
    return 1 if any(r["held"] == "NO" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
