"""The models ntp trains, one entry each with what it can do: the config's checks, the engine's model builder and
the memory plan read these capabilities instead of comparing model names.

Adding a model: an entry here, its layer in ntp/engine/nn (coupled) or its propagation operator (decoupled), and
the exactness and reference tests that prove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    name: str
    summary: str  #: one line for --help
    archs: tuple[str, ...] = ("decoupled", "coupled")  #: the architectures it exists in
    graph: str = "homogeneous"  #: homogeneous, or heterogeneous (node types and relations)
    operator: str | None = "gcn"  #: the propagation operator of its decoupled form (ntp.engine.graph.operators)
    attention: bool = False  #: edge values computed every step on the device: no offload, overlap or streaming
    mlp_activation: bool = True  #: the decoupled NN stage's hidden layers have ReLUs (SGC's are linear)
    teleport: bool = False  #: decoupled propagation restarts to the NN stage's output with --alpha (APPNP)
    root_term: bool = False  #: a coupled layer reads its input again after propagation (GraphSAGE's root weight)
    inner_mlp: bool = False  #: a coupled layer holds an MLP with a hidden-wide activation (GIN)
    #: options whose default this model changes, as its paper (or PyG's example for it) trains it; a flag or config
    #: file value still wins (ntp.config.TrainConfig.from_dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    defaults_source: str = ""  #: where ``defaults`` come from, for --help

    @property
    def heterogeneous(self) -> bool:
        return self.graph == "heterogeneous"

    @property
    def row_wise(self) -> bool:
        """Everything but propagation works row by row (what --nn-device stream needs): not attention or relations."""
        return not self.attention and not self.heterogeneous


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("gcn", "graph convolution (Kipf & Welling)"),
        ModelSpec(
            "sgc",
            "simplified graph convolution: linear NN stage, K propagation steps",
            archs=("decoupled",),
            mlp_activation=False,
        ),
        ModelSpec(
            "appnp",
            "personalised PageRank propagation of an MLP's output",
            archs=("decoupled",),
            teleport=True,
            defaults={"prop_steps": 10},
            defaults_source="Gasteiger et al. 2019: K=10 power-iteration steps",
        ),
        ModelSpec("sage", "GraphSAGE, mean aggregation with a root weight", operator="mean_self", root_term=True),
        ModelSpec(
            "gin", "graph isomorphism network, sum aggregation and a 2-layer MLP", operator="sum_root", inner_mlp=True
        ),
        ModelSpec("gat", "graph attention, --heads heads", operator=None, attention=True),
        ModelSpec(
            "rgcn",
            "relational GCN, for heterogeneous stores (prepare them with --add-reverse: the paper's inverse relations)",
            graph="heterogeneous",
            operator=None,
            defaults={"arch": "coupled", "hidden": 16, "dropout": 0.0, "weight_decay": 0.0, "epochs": 50},
            defaults_source="Schlichtkrull et al. 2018 (AIFB, tkipf/relational-gcn): 2 coupled layers of 16, "
            "no dropout or L2, 50 epochs of Adam at 0.01",
        ),
    )
}


def model_spec(name: str) -> ModelSpec:
    return MODELS[name]


def model_default(model: str, name: str, default: Any) -> Any:
    """Option ``name``'s default under ``model``: the model's own (:attr:`ModelSpec.defaults`), else ``default``."""
    spec = MODELS.get(model)
    return spec.defaults.get(name, default) if spec is not None else default


def models_help() -> str:
    """The --model help text: each model, what it is, and the defaults it changes."""

    def one(s: ModelSpec) -> str:
        if not s.defaults:
            return f"{s.name}: {s.summary}"
        changed = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in s.defaults.items())
        return f"{s.name}: {s.summary}; its defaults: {changed} ({s.defaults_source})"

    return "; ".join(one(s) for s in MODELS.values()) + "."
