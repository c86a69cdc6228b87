"""The Prefect `predict` flow (ephemeral API): a registered model's URI and a store -> a layer's embeddings written by
a 2-rank torchrun job, equal to one process's; its deployment in prefect.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ntp.run.cli import main as ntp_main
from tests.pipeline.conftest import PROJECT

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]


@pytest.mark.slow
def test_predict_flow_publishes_embeddings_of_a_registered_model(tmp_path: Path) -> None:
    from flows.params import LaunchOptions
    from flows.predict import predict
    from storage import prepare

    store = str(
        prepare(
            "synthetic",
            nodes=70,
            avg_degree=4.0,
            features=5,
            classes=3,
            seed=4,
            out=tmp_path / "s",
            progress=lambda s: None,
        )
    )
    model = str(tmp_path / "model.pt")
    assert (
        ntp_main(
            [
                "train",
                "--store",
                store,
                "--nproc",
                "1",
                "--epochs",
                "4",
                "--hidden",
                "8",
                "--model-out",
                model,
                "--experiment",
                "predict-flow",
                "--register",
                "ntp-flow",
            ]
        )
        == 0
    )
    out = tmp_path / "embeddings"
    done = predict(
        store=store,
        model_uri="models:/ntp-flow/1",
        out=str(out),
        export="embeddings",
        layer=0,
        launch=LaunchOptions(nproc=2, device="cpu", job_timeout_s=120),
    )
    assert done["world_size"] == 2 and json.loads((out / "_ntp.json").read_text())["model"] == "models:/ntp-flow/1"
    flowed = pd.read_parquet(out)
    assert (
        ntp_main(
            [
                "predict",
                "--model",
                model,
                "--store",
                store,
                "--export",
                "embeddings",
                "--layer",
                "0",
                "--row-group",
                "30",
                "--out",
                str(tmp_path / "local"),
            ]
        )
        == 0
    )  # one process
    local = pd.read_parquet(tmp_path / "local")
    assert flowed["node_id"].tolist() == list(range(70))
    assert np.stack(local["embedding"]).shape == (70, 8)  # the hidden layer's width
    np.testing.assert_allclose(np.stack(flowed["embedding"]), np.stack(local["embedding"]), atol=1e-6)
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "local" / "part-00000.parquet").num_row_groups == 3  # 70 rows, 30 per group


def test_predict_deployment_is_declared_and_loads() -> None:
    from prefect.flows import load_flow_from_entrypoint

    deployments = {d["name"]: d for d in yaml.safe_load((PROJECT / "prefect.yaml").read_text())["deployments"]}
    predict = deployments["predict"]
    assert load_flow_from_entrypoint(str(PROJECT / predict["entrypoint"])).name == "predict"
    assert predict["schedules"][0]["cron"] and predict["schedules"][0]["active"] is False  # parameters first
