"""The `pipeline` flow: prepare -> train (and register the challenger) -> evaluate (and publish embeddings) ->
promote the challenger to champion if it wins, then a markdown artifact with the results."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.params import PipelineParams
from flows.predict import predict
from flows.train import run_training
from ntp.errors import ConfigError
from ntp.run.tracking import run_url
from tasks.evaluate import evaluate_model
from tasks.prepare import prepare_store
from tasks.promote import promote_challenger
from tasks.publish import artifact_key, publish_results, results_markdown


@flow(name="pipeline")
def pipeline(params: PipelineParams) -> dict[str, Any]:
    """Build (or reuse) the store, train with MLflow tracking (registering the best model when asked), evaluate it,
    publish its embeddings when asked, and the results."""
    if params.embeddings_out and params.launch.nnodes > 1:
        raise ConfigError(
            "embeddings_out publishes from one node; for a multi-node model run the predict flow on "
            "every node (export embeddings), or leave embeddings_out empty"
        )
    store = prepare_store(params.dataset.name, params.dataset.prepare_kwargs())
    trained = run_training(store, params.training, params.launch, params.experiment, params.registered_model)
    if trained.run_id is None:  # node rank > 0 of a multi-node job: rank 0's node evaluates and tracks
        return {"store": store, "run_id": None}
    evaluation: dict[str, Any] = {}
    embeddings = None
    if trained.model_path is not None:
        evaluation = evaluate_model(str(trained.model_path), store, trained.run_id)
        if params.embeddings_out:  # on the training's processes: what trained the model can apply it
            launch = params.launch.model_copy(update={"nproc": trained.world_size})
            embeddings = predict(
                store=store,
                model_uri=str(trained.model_path),
                out=params.embeddings_out,
                export="embeddings",
                launch=launch,
            )["out"]
    champion = None
    if params.registered_model and trained.registered_version:  # challenger; champion if it wins
        final = trained.final
        champion = promote_challenger(
            params.registered_model,
            trained.registered_version,
            run_id=trained.run_id,
            store=store,
            valid_metric=final.best_valid_metric if final else None,
            test_metric=evaluation.get("test"),
            margin=params.champion_margin,
            predictions_out=params.predictions_out,
        )
    markdown = results_markdown(
        dataset=params.dataset.name,
        config=trained.config,
        summary=trained.summary,
        evaluation=evaluation,
        run_id=trained.run_id,
        run_link=run_url(trained.run_id),
        world_size=trained.world_size,
    )
    publish_results(markdown, artifact_key(params.dataset.name))
    return {
        "store": store,
        "run_id": trained.run_id,
        "summary": trained.summary,
        "evaluation": evaluation,
        "embeddings": embeddings,
        "champion": champion,
    }
