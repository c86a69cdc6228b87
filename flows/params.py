"""Typed flow parameters: pydantic models, so the Prefect UI renders a form with descriptions and defaults.

`TrainingOptions` is generated from :class:`ntp.config.TrainConfig` (same names, types, defaults and help),
so the form never drifts from the engine's configuration.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ntp.config import REPEAT_OPTIONS, TrainConfig
from ntp.spec import Device, LaunchSpec, resolve
from storage.schema import SPLIT_PER_CLASS


class DatasetOptions(BaseModel):
    """What `ntp data prepare` takes: which graph and how to preprocess it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="OGB name (e.g. ogbn-arxiv), 'synthetic', or any name together with from_dir.")
    from_dir: str | None = Field(None, description="Read an already unzipped OGB-layout folder (offline).")
    from_npz: str | None = Field(
        None, description="Read a heterophilous benchmark's .npz (tolokers.npz, ...): all ten splits kept."
    )
    mirror: str | None = Field(None, description="Download the OGB zip from this mirror URL instead of OGB.")
    data_dir: str | None = Field(None, description="Data directory (default: $NTP_DATA_DIR or ./data).")
    out: str | None = Field(None, description="Store path (default: chosen from the name and options).")
    symmetrize: bool = Field(False, description="Add the reverse of every edge.")
    self_loops: bool = Field(False, description="Add a self-loop to every vertex.")
    dedup: bool = Field(False, description="Remove duplicate edges.")
    drop_self_loops: bool = Field(False, description="Remove self-loops present in the source.")
    normalize_features: bool = Field(
        False, description="Divide each vertex's features by their L1 norm (Kipf & Welling, PyG's NormalizeFeatures)."
    )
    largest_component: bool = Field(
        False,
        description="Keep only the largest connected component (Shchur et al., PyG's LargestConnectedComponents).",
    )
    feature_dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="Stored feature dtype.")
    nodes: int | None = Field(None, description="synthetic: number of vertices.")
    avg_degree: float | None = Field(None, description="synthetic: average in-degree.")
    features: int | None = Field(None, description="synthetic: feature width.")
    classes: int | None = Field(None, description="synthetic: number of classes.")
    seed: int = Field(0, description="Seed of the synthetic generator, of link_split and of random_splits.")
    edges: str | None = Field(None, description="Your own graph: edge list file (Parquet or CSV).")
    node_features: str | None = Field(None, description="Your own graph: features (.npy or Parquet).")
    labels: str | None = Field(None, description="Your own graph: labels file.")
    splits: str | None = Field(None, description="Your own graph: folder or file with train/valid/test indices.")
    force: bool = Field(False, description="Rebuild even when the store exists.")
    link_split: str | None = Field(
        None,
        description="Link prediction for any homogeneous graph: 'VAL,TEST' fractions "
        "of a seeded random edge split with negatives (e.g. '0.05,0.1').",
    )
    link_metric: str = Field("hits@20", description="Metric of a link_split store: hits@K or rocauc.")
    random_splits: int | None = Field(
        None,
        description="Replace the graph's split with this many seeded random class-balanced splits "
        "(Shchur et al.'s protocol); train with split K or splits 'all'.",
    )
    split_per_class: str = Field(
        SPLIT_PER_CLASS, description="With random_splits: 'TRAIN,VALID' labelled vertices a class; the rest test."
    )
    add_reverse: bool = Field(
        False,
        description="Heterogeneous graphs (OGB's ogbn-mag layout): add the reverse "
        "rev_REL of every relation, as R-GCN uses.",
    )

    def prepare_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``storage.prepare`` (everything but the name)."""
        return self.model_dump(exclude={"name"})


#: TrainConfig fields that are test hooks, not options: accepted (tests pass them to the flows, also through a
#: deployment run's parameters) but left out of the Prefect UI's form.
HIDDEN_FROM_FORM = ("fail_at_epoch", "fail_rank")


def _hide_from_form(schema: dict[str, Any]) -> None:
    """Move the test hooks from ``properties`` (what Prefect's UI renders as form fields) to ``patternProperties``
    (which the form ignores): with ``additionalProperties: false`` the server's parameter validation still accepts
    them, with their types, and still rejects any other unknown name."""
    props = schema.get("properties", {})
    hidden = {f"^{name}$": props.pop(name) for name in HIDDEN_FROM_FORM if name in props}
    if hidden:
        schema.setdefault("patternProperties", {}).update(hidden)


def _training_options() -> type[BaseModel]:
    hints = typing.get_type_hints(TrainConfig)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "store" or f.name in REPEAT_OPTIONS:
            continue  # the store comes from the prepare step (or the train flow's own parameter); one job a flow
        fields[f.name] = (hints[f.name], Field(f.default, description=f.metadata["help"]))
    return create_model(
        "TrainingOptions",
        __config__=ConfigDict(extra="forbid", json_schema_extra=_hide_from_form),
        __doc__="Training options: the fields of ntp.config.TrainConfig.",
        **fields,
    )


TrainingOptions = _training_options()


def default_nproc() -> int:
    """One process per visible GPU, else a CPU count (the engine's default, ``ntp.run.launch.default_nproc``)."""
    from ntp.run.launch import default_nproc as engine_default

    return engine_default()


class LaunchOptions(BaseModel):
    """How the training job is launched (torchrun) and supervised."""

    model_config = ConfigDict(extra="forbid")

    nproc: int | None = Field(
        None,
        ge=1,
        description="Processes per node. Empty: one per visible GPU, else 2 on CPU (1 with mode single), as ntp train.",
    )
    nnodes: int = Field(1, ge=1, description="Number of nodes (multi-node: run the flow on every node).")
    node_rank: int | None = Field(
        None,
        ge=0,
        description="This node's rank (node 0 hosts the rendezvous and tracks "
        "the run). Empty: assigned by the rendezvous.",
    )
    rdzv_endpoint: str | None = Field(None, description="Rendezvous HOST:PORT for multi-node jobs.")
    interface: str | None = Field(
        None, description="Network interface the ranks talk over. Empty: the one that routes to the rendezvous host."
    )
    job_id: str | None = Field(
        None, description="The job's id on every node. Empty: derived from the endpoint and the options."
    )
    device: Device = Field(
        "auto", description="Where ranks compute: cuda (one GPU per rank), cpu, or auto (cuda where a GPU is visible)."
    )
    job_timeout_s: float | None = Field(
        None, gt=0, description="Stop the whole job after this many seconds (empty: no limit)."
    )
    retries: int = Field(0, ge=0, description="Retry a failed training job this many times.")
    retry_delay_s: float = Field(10.0, ge=0, description="Seconds between retries.")


def launch_spec(training: BaseModel, launch: LaunchOptions, *, store: str) -> LaunchSpec:
    """The resolved launch of the form's training and launch options on ``store`` (ntp.spec.resolve)."""
    cfg = TrainConfig.from_dict({**training.model_dump(exclude_unset=True), "store": store})
    return resolve(
        cfg,
        nproc=launch.nproc,
        nnodes=launch.nnodes,
        node_rank=launch.node_rank,
        rdzv_endpoint=launch.rdzv_endpoint,
        device=launch.device,
        job_timeout_s=launch.job_timeout_s,
        interface=launch.interface,
        job_id=launch.job_id,
    )


class PipelineParams(BaseModel):
    """prepare -> train -> evaluate, one form."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetOptions = Field(description="The graph and its preprocessing (as `ntp data prepare`).")
    training: TrainingOptions = Field(
        default_factory=TrainingOptions,  # type: ignore[valid-type]
        description="Model and training options (as `ntp train`).",
    )
    launch: LaunchOptions = Field(default_factory=LaunchOptions, description="Processes, nodes, timeout, retries.")
    experiment: str | None = Field(None, description="MLflow experiment (default: the dataset's name).")
    registered_model: str | None = Field(
        None, description="Register the best model as a new version of this name in the MLflow model registry."
    )
    champion_margin: float = Field(
        0.0,
        ge=0,
        description="With registered_model: the new version is the 'challenger'; the 'champion' alias moves to it "
        "only if its validation metric beats the champion's on the same store by more than this.",
    )
    predictions_out: str | None = Field(
        None,
        description="Where the predict deployment's trigger writes the new champion's predictions "
        "(default: <data dir>/predictions/<registered model>).",
    )
    embeddings_out: str | None = Field(
        None,
        description="Publish the best model's node embeddings (last hidden "
        "layer) there as a Parquet dataset, replaced on every run.",
    )
