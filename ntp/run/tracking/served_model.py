"""The code of ntp's MLflow model (MLflow's "models from code": this file is stored with the model and run when it
is loaded). ``predict`` takes node ids and returns their predictions.

    model = mlflow.pyfunc.load_model("models:/cora-gcn/1")            # or runs:/..., or the logged model's URI
    model.predict(pandas.DataFrame({"node_id": [0, 5, 7]}))           # node_id, pred, prob
    mlflow.pyfunc.load_model(uri, model_config={"store": "/data/stores/cora-..."})  # the store where it is now

A full-graph model needs the whole graph to predict any node: the first call runs one forward pass over the store
(in this process) and keeps every node's prediction; later calls look them up. The store is the one the model was
trained on (its path is in the model config; the fingerprint is checked). For graphs that need several processes,
use `ntp predict` (or the Prefect ``predict`` flow) and serve its Parquet export.
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd


class NodePredictor(mlflow.pyfunc.PythonModel):
    """Node ids in (a ``node_id`` column: the model's signature), predictions out: ``node_id``, ``pred`` (the
    class; 0/1 per task for binary/multi-label stores) and ``prob`` (probabilities per class or task)."""

    def load_context(self, context) -> None:
        self.model_path = context.artifacts["model"]
        self.store = context.model_config["store"]
        self.any_store = bool(context.model_config.get("any_store", False))
        self.table: dict[str, np.ndarray] | None = None

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        ids = model_input["node_id"].to_numpy(dtype=np.int64)
        table = self._predictions()
        n = len(table["node_id"])
        outside = ids[(ids < 0) | (ids >= n)]
        if len(outside):
            raise ValueError(f"node ids {outside[:5].tolist()} are not nodes of store {self.store} (ids 0..{n - 1})")
        return pd.DataFrame(
            {
                "node_id": ids,
                "pred": list(table["pred"][ids]) if table["pred"].ndim > 1 else table["pred"][ids],
                "prob": list(table["prob"][ids]),
            }
        )

    def _predictions(self) -> dict[str, np.ndarray]:
        if self.table is None:
            from ntp.engine.infer.predict import predict_in_process

            self.table = predict_in_process(self.model_path, self.store, self.any_store)
        return self.table


mlflow.models.set_model(NodePredictor())
