"""bench/faults.py: each fault case selects exactly its tests, a case without a test is an error, and a case holds
only when every one of its tests ran and passed."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import faults  # noqa: E402  (bench/ is not a package)


def test_every_case_names_existing_tests_and_only_its_own() -> None:
    faults.check_cases(faults.CASES)  # every named test function exists; none belongs to two cases
    first = faults.CASES[0]
    with pytest.raises(ValueError, match="has no test"):
        faults.check_cases([dataclasses.replace(first, tests=())])
    with pytest.raises(ValueError, match="no test function 'test_sigterm'"):  # a prefix is not a test
        faults.check_cases([dataclasses.replace(first, tests=(first.tests[0].split("_to_")[0],))])
    with pytest.raises(ValueError, match="belongs to two fault cases"):
        faults.check_cases([first, dataclasses.replace(first, case="again")])
    # a result counts only for the case naming its function exactly: a longer name sharing the prefix does not
    labels = next(c for c in faults.CASES if "labels out of range" in c.case)
    f = "tests/storage/test_store_labels.py"
    results = {
        f"{f}::test_huge_label_is_refused": ("passed", ""),
        f"{f}::test_unlabelled_stays_unlabelled": ("failure", "not a fault of this case"),
        f"{f}::test_ogb_folder_labels_are_checked[3-beyond]": ("passed", ""),
    }
    row = faults.row(labels, results)
    assert row["held"] == "NO" and "not a fault of this case" not in row["observed"]
    assert "no result from test_float_label_with_a_fraction_is_refused" in row["observed"]
    assert [c.case for c in faults.select(faults.CASES, "resume")] == [
        "--resume with a changed option",
        "--resume on another store",
        "`ntp train --seeds N` stopped mid-job, then `--continue`",  # by its test's name
    ]


def test_a_case_holds_only_when_every_instance_ran_and_passed() -> None:
    case = faults.Case("low", "c", "e", ("tests/x.py::test_a", "tests/x.py::test_b"))
    passed = {"tests/x.py::test_a[1]": ("passed", ""), "tests/x.py::test_a[2]": ("passed", "")}
    assert faults.row(case, {**passed, "tests/x.py::test_b": ("passed", "")})["held"] == "yes"
    skipped = faults.row(case, {**passed, "tests/x.py::test_b": ("skipped", "Skipped: root reads any file")})
    assert skipped["held"] == "not shown"
    assert "not run here: test_b, because root reads any file" in skipped["observed"]
    failed = faults.row(case, {**passed, "tests/x.py::test_b": ("failure", "AssertionError: left")})
    assert failed["held"] == "NO" and "FAILED test_b: AssertionError: left" in failed["observed"]
    assert faults.row(case, passed)["held"] == "NO"  # test_b never reported


def test_the_matrix_replaces_only_its_block_of_the_page(tmp_path, monkeypatch) -> None:
    page = tmp_path / "reliability.md"
    page.write_text(f"intro\n{faults.BEGIN}\nold table\n{faults.END}\n\n## next\n")
    monkeypatch.setattr(faults, "DOC", page)
    faults.write_docs("Run of today, commit abc.\n\n| new |")
    assert page.read_text() == f"intro\n{faults.BEGIN}\nRun of today, commit abc.\n\n| new |\n{faults.END}\n\n## next\n"
    assert faults.BEGIN in (faults.REPO / "docs" / "reliability.md").read_text()  # the real page has the block
