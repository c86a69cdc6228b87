"""Link-prediction metrics: Hits@K, MRR and ROC-AUC of positive edges ranked against negative ones.

OGB datasets are scored by OGB's own ``ogb.linkproppred.Evaluator``; other stores (``--link-split``) by the same
definitions written out here (tests check that both agree):
- hits@K: the fraction of positive edges scored above the K-th highest negative (1.0 with fewer than K negatives);
- mrr: negatives [E, K] per positive; rank = 1 + (#negatives above + #negatives tied or above) / 2; mean of 1 / rank;
- rocauc: over all positive and negative scores.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from ntp.engine.tasks.evaluation import _ogb_evaluator_class


def link_metric(metric: str, pos: torch.Tensor, neg: torch.Tensor, ogb_name: str | None = None) -> float:
    """``pos`` [E] scores of positive edges; ``neg`` [E_neg] (hits@K, rocauc) or [E, K] (mrr) scores of negatives."""
    return link_evaluator(metric, ogb_name)(pos, neg)


def link_evaluator(metric: str, ogb_name: str | None = None) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """:func:`link_metric` of ``(pos, neg)`` with OGB's Evaluator built now, once (importing it takes seconds: a
    training job builds it at setup, not in its first evaluation)."""
    if ogb_name is None:
        compute = partial(_metric, metric)
    else:
        evaluator = _ogb_evaluator_class("linkproppred")(ogb_name)
        compute = partial(_ogb_metric, evaluator, metric)

    def score(pos: torch.Tensor, neg: torch.Tensor) -> float:
        if len(pos) == 0:
            return float("nan")
        return compute(pos.detach().float().cpu(), neg.detach().float().cpu())

    return score


def _ogb_metric(evaluator: Any, metric: str, pos: torch.Tensor, neg: torch.Tensor) -> float:
    result = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})
    return float(result["mrr_list"].float().mean()) if metric == "mrr" else float(result[metric])


def _metric(metric: str, pos: torch.Tensor, neg: torch.Tensor) -> float:
    if metric.startswith("hits@"):
        k = int(metric.split("@", 1)[1])
        if len(neg) < k:
            return 1.0
        kth = torch.topk(neg, k).values[-1]
        return float((pos > kth).double().mean())
    if metric == "mrr":
        above = (neg > pos.view(-1, 1)).sum(1)
        at_or_above = (neg >= pos.view(-1, 1)).sum(1)
        rank = 0.5 * (above + at_or_above).float() + 1
        return float((1.0 / rank.double()).mean())
    if metric == "rocauc":
        from sklearn.metrics import roc_auc_score

        y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
        return float(roc_auc_score(y, torch.cat([pos, neg.reshape(-1)]).numpy()))
    raise ValueError(f"unknown link-prediction metric {metric!r}; expected hits@K, mrr or rocauc")
