"""`ntp data prepare --random-splits N`: Shchur et al.'s class-balanced random splits, stored as split sets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from store_helpers import quiet

from storage import open_store
from storage.cli import main
from storage.prepare import prepare
from storage.random_splits import with_random_splits
from storage.schema import StoreError
from storage.sources.synthetic import SyntheticSpec, synthetic_source


def _photo(shared: Path, tmp_path: Path, sets: int, **options) -> object:
    path = prepare(
        "amazon-photo",
        from_dir=shared / "ogb-layout/amazon-photo",
        data_dir=tmp_path,
        random_splits=sets,
        progress=quiet,
        **options,
    )
    return open_store(path)


def test_every_set_takes_its_count_a_class_and_the_rest_is_test(shared_datasets: Path, tmp_path: Path) -> None:
    store = _photo(shared_datasets, tmp_path, 3, split_per_class="5,7")
    y = store.labels()
    labelled = np.flatnonzero(y >= 0)
    sets = []
    for k in range(3):
        train, valid, test = (store.split(name, k) for name in ("train", "valid", "test"))
        for ids, per_class in ((train, 5), (valid, 7)):
            assert np.bincount(y[ids], minlength=8).tolist() == [per_class] * 8
        assert np.array_equal(np.sort(np.concatenate([train, valid, test])), labelled)  # disjoint, all labelled
        sets.append(train)
    assert not np.array_equal(sets[0], sets[1]) and not np.array_equal(sets[1], sets[2])
    with pytest.raises(ValueError, match="3 split set"):
        store.split("train", 3)


def test_a_set_does_not_depend_on_how_many_are_drawn_and_the_seed_changes_it(
    shared_datasets: Path, tmp_path: Path
) -> None:
    three, two = _photo(shared_datasets, tmp_path, 3), _photo(shared_datasets, tmp_path, 2)
    assert three.location != two.location  # different options, different stores
    for k in range(2):
        assert np.array_equal(three.split("valid", k), two.split("valid", k))
    other_seed = _photo(shared_datasets, tmp_path, 2, seed=1)
    assert not np.array_equal(other_seed.split("train", 0), two.split("train", 0))
    assert three.meta.source["random_splits"] == {"sets": 3, "per_class": [20, 30], "seed": 0}
    assert "--random-splits 3 --split-per-class 20,30 --seed 0" in three.meta.rebuild_command


def test_a_class_too_small_for_the_draw_is_named(tmp_path: Path) -> None:
    # 120 vertices in 8 classes: about 15 a class, fewer than 20 + 30
    with pytest.raises(StoreError, match=r"class \d+ has \d+ labelled vertices.*Fix: lower --split-per-class"):
        prepare("synthetic", nodes=120, classes=8, data_dir=tmp_path, random_splits=2, progress=quiet)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--random-splits", "2", "--split-per-class", "20"], "is not two integers"),
        (["--random-splits", "2", "--split-per-class", "0,30"], "train needs at least 1"),
        (["--random-splits", "0"], "draw at least one split"),
        (["--random-splits", "2", "--link-split", "0.1,0.1"], "pass only one"),
    ],
)
def test_bad_options_are_refused_with_the_fix(argv: list[str], problem: str, tmp_path: Path, capsys) -> None:
    args = ["data", "prepare", "synthetic", "--nodes", "800", "--classes", "4", "--data-dir", str(tmp_path)]
    assert main(args + argv) != 0
    err = capsys.readouterr().err
    assert problem in err and "Fix:" in err
    assert not [p for p in tmp_path.glob("stores/*") if p.is_dir()]  # no store built


def test_a_heterogeneous_graph_is_refused(shared_datasets: Path, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="heterogeneous.*Fix: drop --random-splits"):
        prepare("aifb", from_dir=shared_datasets / "ogb-hetero/aifb", data_dir=tmp_path, random_splits=2)


def test_the_source_labels_are_read_once() -> None:
    """The draws and the store's labels share one read of the source's labels (a large graph's take a while)."""
    reads = []
    base = synthetic_source(SyntheticSpec(nodes=400, classes=4))
    counted = dataclasses.replace(base, labels=lambda: reads.append(1) or base.labels())
    source = with_random_splits(counted, 2, (5, 5), seed=0)
    source.splits()
    assert np.array_equal(source.labels(), base.labels()) and len(reads) == 1
