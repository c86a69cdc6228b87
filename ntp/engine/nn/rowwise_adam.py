"""Adam whose updates of embedding tables are row-wise (lazy): a row that got no gradient this step keeps its value
and its moments, as DGL's ``SparseAdam`` on ``NodeEmbedding`` and torch's ``SparseAdam`` do. Other parameters get
ordinary Adam (with L2 weight decay). For a column slice (all rows of this rank's columns) a row counts as touched
when its gradient is not zero in any column of any rank: ``touched`` combines the ranks' row masks (an all-reduce),
so every rank updates the same rows of its own columns and the result does not depend on the world size."""

from __future__ import annotations

import torch


class RowwiseAdam(torch.optim.Optimizer):
    """Parameter groups with ``rowwise=True`` are updated row by row where their gradient is not zero."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        touched=lambda mask: mask,
    ) -> None:  # noqa: ANN001
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, rowwise=False))
        self.touched = touched

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if not state:
                    state["step"] = torch.zeros(p.shape[:1] if group["rowwise"] else (), dtype=torch.float64)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                if group["rowwise"]:
                    rows = self.touched(grad.reshape(grad.shape[0], -1).ne(0).any(dim=1)).nonzero()[:, 0]
                    self._update(p, grad, state, rows, group, beta1, beta2)
                else:
                    if group["weight_decay"]:
                        grad = grad.add(p, alpha=group["weight_decay"])
                    self._update(p, grad, state, None, group, beta1, beta2)

    @staticmethod
    def _update(p, grad, state, rows, group, beta1: float, beta2: float) -> None:  # noqa: ANN001
        sel = slice(None) if rows is None else rows
        if rows is None:
            state["step"] += 1
            t = state["step"].to(p.dtype)
        else:
            state["step"][rows] += 1
            t = state["step"][rows].to(p.dtype).reshape(-1, *([1] * (p.dim() - 1)))
        m, v = state["exp_avg"][sel], state["exp_avg_sq"][sel]
        g = grad[sel]
        m = m.mul(beta1).add(g, alpha=1 - beta1)
        v = v.mul(beta2).addcmul(g, g, value=1 - beta2)
        state["exp_avg"][sel], state["exp_avg_sq"][sel] = m, v
        step = group["lr"] * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + group["eps"])
        p[sel] = p[sel] - step
