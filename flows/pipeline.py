"""The `pipeline` flow: prepare -> train -> evaluate, then a markdown artifact with the results."""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.params import PipelineParams
from flows.train import run_training
from ntp.run.tracking import run_url
from tasks.evaluate import evaluate_model
from tasks.prepare import prepare_store
from tasks.publish import artifact_key, publish_results, results_markdown


@flow(name="pipeline")
def pipeline(params: PipelineParams) -> dict[str, Any]:
    """Build (or reuse) the store, train with MLflow tracking, evaluate the best model, publish the results."""
    store = prepare_store(params.dataset.name, params.dataset.prepare_kwargs())
    trained = run_training(store, params.training, params.launch, params.experiment)
    if trained.run_id is None:  # node rank > 0 of a multi-node job: rank 0's node evaluates and tracks
        return {"store": store, "run_id": None}
    evaluation: dict[str, Any] = {}
    if trained.model_path is not None:
        evaluation = evaluate_model(str(trained.model_path), store, trained.run_id)
    markdown = results_markdown(dataset=params.dataset.name, config=trained.config, summary=trained.summary,
                                evaluation=evaluation, run_id=trained.run_id, run_link=run_url(trained.run_id),
                                world_size=trained.world_size)
    publish_results(markdown, artifact_key(params.dataset.name))
    return {"store": store, "run_id": trained.run_id, "summary": trained.summary, "evaluation": evaluation}
