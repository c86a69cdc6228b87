"""Typed flow parameters: pydantic models, so the Prefect UI renders a form with descriptions and defaults.

`TrainingOptions` is generated from :class:`ntp.config.TrainConfig` (same names, types, defaults and help),
so the form never drifts from the engine's configuration.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ntp.config import TrainConfig


class DatasetOptions(BaseModel):
    """What `ntp data prepare` takes: which graph and how to preprocess it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="OGB name (e.g. ogbn-arxiv), 'synthetic', or any name together with from_dir.")
    from_dir: str | None = Field(None, description="Read an already unzipped OGB-layout folder (offline).")
    mirror: str | None = Field(None, description="Download the OGB zip from this mirror URL instead of OGB.")
    data_dir: str | None = Field(None, description="Data directory (default: $NTP_DATA_DIR or ./data).")
    out: str | None = Field(None, description="Store path (default: chosen from the name and options).")
    symmetrize: bool = Field(False, description="Add the reverse of every edge.")
    self_loops: bool = Field(False, description="Add a self-loop to every vertex.")
    dedup: bool = Field(False, description="Remove duplicate edges.")
    drop_self_loops: bool = Field(False, description="Remove self-loops present in the source.")
    feature_dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="Stored feature dtype.")
    nodes: int | None = Field(None, description="synthetic: number of vertices.")
    avg_degree: float | None = Field(None, description="synthetic: average in-degree.")
    features: int | None = Field(None, description="synthetic: feature width.")
    classes: int | None = Field(None, description="synthetic: number of classes.")
    seed: int = Field(0, description="synthetic: generator seed.")
    edges: str | None = Field(None, description="Your own graph: edge list file (Parquet or CSV).")
    node_features: str | None = Field(None, description="Your own graph: features (.npy or Parquet).")
    labels: str | None = Field(None, description="Your own graph: labels file.")
    splits: str | None = Field(None, description="Your own graph: folder or file with train/valid/test indices.")
    force: bool = Field(False, description="Rebuild even when the store exists.")

    def prepare_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``storage.prepare`` (everything but the name)."""
        return self.model_dump(exclude={"name"})


def _training_options() -> type[BaseModel]:
    hints = typing.get_type_hints(TrainConfig)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "store":
            continue  # the store comes from the prepare step (or the train flow's own parameter)
        if f.name == "mode":
            fields["mode"] = (hints["mode"] | None, Field(None, description=f.metadata["help"]
                                                         + " Empty: tp when nproc > 1, else single."))
            continue
        fields[f.name] = (hints[f.name], Field(f.default, description=f.metadata["help"]))
    return create_model("TrainingOptions", __config__=ConfigDict(extra="forbid"),
                        __doc__="Training options: the fields of ntp.config.TrainConfig.", **fields)


TrainingOptions = _training_options()


def default_nproc() -> int:
    """One process per visible GPU, else a CPU count (the engine's default, ``ntp.launch.default_nproc``)."""
    from ntp.launch import default_nproc as engine_default

    return engine_default()


class LaunchOptions(BaseModel):
    """How the training job is launched (torchrun) and supervised."""

    model_config = ConfigDict(extra="forbid")

    nproc: int | None = Field(None, ge=1, description="Processes per node. Empty: one per visible GPU, "
                                                       "else a CPU count (as ntp train).")
    nnodes: int = Field(1, ge=1, description="Number of nodes (multi-node: run the flow on every node).")
    node_rank: int = Field(0, ge=0, description="This node's rank (0 tracks the run in MLflow).")
    rdzv_endpoint: str | None = Field(None, description="Rendezvous HOST:PORT for multi-node jobs.")
    timeout_s: float | None = Field(None, gt=0,
                                    description="Kill the whole job after this many seconds (empty: no limit).")
    retries: int = Field(0, ge=0, description="Retry a failed training job this many times.")
    retry_delay_s: float = Field(10.0, ge=0, description="Seconds between retries.")

    def resolved_nproc(self) -> int:
        return self.nproc or default_nproc()


def train_config(training: BaseModel, *, store: str, nproc: int) -> TrainConfig:
    """The TrainConfig of ``training`` for ``store``; an empty mode becomes tp when nproc > 1, else single."""
    values = training.model_dump()
    values["mode"] = values.get("mode") or ("tp" if nproc > 1 else "single")
    return TrainConfig.from_dict({**values, "store": store})


class PipelineParams(BaseModel):
    """prepare -> train -> evaluate, one form."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetOptions = Field(description="The graph and its preprocessing (as `ntp data prepare`).")
    training: TrainingOptions = Field(default_factory=TrainingOptions,  # type: ignore[valid-type]
                                      description="Model and training options (as `ntp train`).")
    launch: LaunchOptions = Field(default_factory=LaunchOptions, description="Processes, nodes, timeout, retries.")
    experiment: str | None = Field(None, description="MLflow experiment (default: the dataset's name).")
