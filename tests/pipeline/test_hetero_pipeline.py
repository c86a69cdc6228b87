"""The Prefect pipeline on a heterogeneous OGB folder: prepare (with reverse relations) -> R-GCN on 2 ranks ->
evaluate, tracked in MLflow with the target type the metric is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntp.run import tracking
from tests.storage.test_store_hetero import tiny_folder

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300), pytest.mark.slow]


def test_pipeline_trains_rgcn_and_names_the_target_type(tmp_path: Path) -> None:
    from flows.params import PipelineParams
    from flows.pipeline import pipeline

    folder = tiny_folder(tmp_path / "tiny")
    params = PipelineParams(
        dataset={"name": "tiny-hetero", "from_dir": str(folder), "add_reverse": True},
        training={"model": "rgcn", "arch": "coupled", "epochs": 2, "hidden": 4, "dropout": 0.0},
        launch={"nproc": 2, "device": "cpu", "job_timeout_s": 120},
        experiment="hetero-test",
    )
    result = pipeline(params)
    run = tracking.client().get_run(result["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["model"] == "rgcn"
    assert run.data.tags["ntp.target_type"] == "paper"
    assert run.data.params["data.node_types"] == "2" and run.data.params["data.relations"] == "4"
    assert result["evaluation"]["target_type"] == "paper" and 0.0 <= result["evaluation"]["test"] <= 1.0
