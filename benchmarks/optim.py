"""The optimiser and learning-rate schedule a run's settings name (:func:`build_optimizer`, :func:`lr_schedule`), and
those the authors' code uses that PyTorch does not ship: BERT's (below) and GRU4Rec's Adagrad (:class:`GRU4RecAdagrad`).

:class:`AdamWeightDecay` is BERT's ``AdamWeightDecayOptimizer`` (``optimization.py`` of google-research/bert,
which the BERT4Rec authors' code uses as it is), and :func:`bert_schedule` the learning rate of BERT's
``create_optimizer``. With g the (clipped) gradient and step s = 0, 1, …:

    m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²          (no bias correction of m and v)
    θ ← θ − η_s (m / (√v + ε) + λ θ)                         (λ = 0 for the groups that exclude weight decay)
    η_s = η · s / W  for s < W (linear warm-up from 0),  else η · (1 − min(s, T) / T)

so the decay (polynomial, power 1) runs to 0 over all T training steps, warm-up included.
"""
from __future__ import annotations

import torch

from recbench.benchmarks.device import fused_adam


class AdamWeightDecay(torch.optim.Optimizer):
    """BERT's Adam with decoupled weight decay and without bias correction (module docstring). Parameter groups
    may set their own ``weight_decay`` (0 for biases and LayerNorm, as the official code excludes them)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["m"] = torch.zeros_like(param)
                    state["v"] = torch.zeros_like(param)
                m, v, grad = state["m"], state["v"], param.grad
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(param, alpha=group["weight_decay"])
                param.add_(update, alpha=-group["lr"])
        return loss


def bert_schedule(step: int, warmup_steps: int, total_steps: int) -> float:
    """η_s / η of BERT's ``create_optimizer`` at step ``step`` (0-based): s/W during the warm-up, then
    1 − min(s, T)/T."""
    if warmup_steps and step < warmup_steps:
        return step / warmup_steps
    return 1.0 - min(step, total_steps) / total_steps


class GRU4RecAdagrad(torch.optim.Optimizer):
    """Adagrad as GRU4Rec's authors' code computes it: G ← G + g², θ ← θ − lr · (g / √(G + ε) + λ θ), with
    ε = 1e-6 inside the root (``torch.optim.Adagrad`` adds its ε outside) and the L2 term λ θ outside the
    scaling. A parameter row whose gradient is zero keeps its G, as in the code's sparse updates of sampled rows."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, eps: float = 1e-6):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["sum"] = torch.zeros_like(p)
                state["sum"].addcmul_(p.grad, p.grad)
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.addcdiv_(p.grad, (state["sum"] + group["eps"]).sqrt_(), value=-group["lr"])


def build_optimizer(settings, model) -> torch.optim.Optimizer:
    """The optimiser ``settings`` (a ``TrainSettings``) name, over ``model``'s parameter groups; Adam and AdamW run
    fused where the device has them (:func:`~benchmarks.device.fused_adam`)."""
    s = settings
    groups = model.parameter_groups()
    if s.optimizer == "adam-weight-decay":
        return AdamWeightDecay(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay)
    if s.optimizer == "adagrad":
        return GRU4RecAdagrad(groups, lr=s.lr, weight_decay=s.weight_decay)
    if s.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=s.lr, weight_decay=s.weight_decay)
    kind = torch.optim.AdamW if s.optimizer == "adamw" else torch.optim.Adam
    return kind(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay,
                fused=fused_adam(model.device))


def lr_schedule(settings, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate's factor at each step (0-based) of ``total_steps`` under ``settings``' warm-up and decay."""
    warmup, decay = settings.warmup_steps, settings.decay

    def factor(step: int) -> float:
        if decay == "polynomial":
            return bert_schedule(step, warmup, total_steps)
        if warmup and step < warmup:
            return (step + 1) / warmup
        if decay == "linear":
            return max(0.0, (total_steps - step) / max(1, total_steps - warmup))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
