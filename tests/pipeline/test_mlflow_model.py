"""The model's life in MLflow (real sqlite store): `ntp train --register` logs the best model as a pyfunc model
(node ids -> predictions) and registers it; `ntp evaluate --run-id --register` logs the evaluation table, per-class
metrics and confusion matrix computed from the exported predictions, and a new version."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from ntp.run.cli import main as ntp_main
from ntp.run.tracking import client


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    from storage import prepare

    return str(
        prepare(
            "synthetic",
            nodes=80,
            avg_degree=4.0,
            features=5,
            classes=3,
            seed=3,
            out=tmp_path_factory.mktemp("mlflow-model") / "synthetic",
            progress=lambda s: None,
        )
    )


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.slow
def test_registered_model_predicts_node_ids_and_evaluation_is_logged(store, tmp_path, capsys) -> None:
    import mlflow

    model = str(tmp_path / "model.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = ntp_main(
            [
                "train",
                "--store",
                store,
                "--nproc",
                "1",
                "--epochs",
                "8",
                "--hidden",
                "8",
                "--model-out",
                model,
                "--results",
                str(tmp_path / "r.jsonl"),
                "--experiment",
                "registry",
                "--register",
                "ntp-test",
            ]
        )
    assert trained == 0
    # MLflow's advice (type hints on predict, an input example) is settled by the model's signature
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
    printed = capsys.readouterr()
    assert "Downloading artifacts" not in printed.err, "no bar for MLflow's copy of the model file"
    out = printed.out
    assert "registered ntp-test version 1" in out
    c = client()
    (run,) = c.search_runs([c.get_experiment_by_name("registry").experiment_id], "tags.`ntp.kind` = 'train'")
    final = json.loads((tmp_path / "r.jsonl").read_text().strip().splitlines()[-1])

    served = mlflow.pyfunc.load_model("models:/ntp-test/1")
    assert served.metadata.metadata["store_fingerprint"] == final["store_fingerprint"]
    assert served.metadata.get_input_schema().input_names() == ["node_id"]
    got = served.predict(pd.DataFrame({"node_id": [0, 5, 79]}))
    assert ntp_main(["predict", "--model", model, "--store", store, "--out", str(tmp_path / "p")]) == 0
    exported = pd.read_parquet(tmp_path / "p").set_index("node_id").loc[[0, 5, 79]]
    assert got["pred"].tolist() == exported["pred"].tolist()
    np.testing.assert_allclose(np.stack(got["prob"]), np.stack(exported["prob"]), atol=1e-6)
    with pytest.raises(Exception, match="not nodes of store"):
        served.predict(pd.DataFrame({"node_id": [80]}))

    capsys.readouterr()
    assert (
        ntp_main(
            [
                "evaluate",
                "--model",
                model,
                "--store",
                store,
                "--nproc",
                "2",
                "--run-id",
                run.info.run_id,
                "--register",
                "ntp-test",
            ]
        )
        == 0
    )
    result = _last_json(capsys.readouterr().out)
    assert result["run_id"] == run.info.run_id and int(result["version"]) == 2
    assert result["test"] == final["test_metric"]
    paths = {a.path for d in ("tables", "plots") for a in c.list_artifacts(run.info.run_id, d)}
    assert {
        "tables/evaluation.json",
        "tables/per_class_test.json",
        "plots/confusion_test.png",
        "plots/curves.png",
    } <= paths
    table = c.load_table(run.info.experiment_id, "tables/evaluation.json", run_ids=[run.info.run_id])
    assert table.set_index("split").loc["test", "value"] == final["test_metric"]  # recomputed from the export
    per_class = c.load_table(run.info.experiment_id, "tables/per_class_test.json", run_ids=[run.info.run_id])
    assert per_class["support"].sum() == table.set_index("split").loc["test", "nodes"]
    assert c.get_run(run.info.run_id).data.metrics["eval/test"] == final["test_metric"]
