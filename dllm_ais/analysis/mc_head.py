"""Per-sequence gradients restricted to the LM head, for the Monte-Carlo ground truth of rung 2 (issue 40).

What is measured: every gradient of rung 2 is the gradient with respect to the LM head's weight W [V, d] alone
(LLaDA `transformer.ff_out`, Dream `lm_head`; every other parameter held fixed) — the coordinates of the full
gradient that belong to W. A log-likelihood term f(z) of logits z = W h at some positions has
∇_W f = Σ_positions (∂f/∂z) hᵀ, so one forward of the (frozen) network per canvas gives h and z, autograd on a
*leaf copy* of z gives ∂f/∂z (cheap: softmaxes, no backbone backward), and the per-sequence gradient is a sum of
outer products. Terms of different canvas rows never share a logit, so one backward of a weighted sum over all rows
yields every row's own ∂f/∂z.

`HeadTap` is a model view that forwards every call to the model and records (head input h, logits z) of the call;
the package's samplers and likelihoods see an ordinary model (shifted-logit Dream too: models/shift.py asks the tap's
model). Vectors are flattened W gradients [V·d], float64 when summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Call:
    """One recorded forward."""

    input_ids: torch.Tensor
    """[n, T] the canvas fed."""
    positions: object
    """The positions argument (slice or [n, m] index) the caller asked logits for."""
    h: torch.Tensor
    """[n, m, d] float32 head input at those positions."""
    z: torch.Tensor
    """[n, m, V] float32 logits (a detached copy: the caller may edit its own in place, as the sampler does)."""


class HeadTap:
    """A callable view of `model` that records every forward's head input and logits (`calls`)."""

    def __init__(self, model):
        self.__dict__["model"] = model
        self.__dict__["calls"] = []
        self.__dict__["record"] = True

    @property
    def head(self) -> torch.nn.Linear:
        return self.model.get_output_embeddings()

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, positions=None,
                 **kwargs):
        box: dict = {}
        hook = self.head.register_forward_hook(lambda mod, inp, out: box.__setitem__("h", inp[0].detach()))
        try:
            with torch.no_grad():
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, positions=positions, **kwargs)
        finally:
            hook.remove()
        if self.record:
            self.calls.append(Call(input_ids, positions, box["h"].float().clone(), out.logits.detach().float().clone()))
        return out

    forward = __call__

    def take(self) -> list[Call]:
        """The calls recorded so far (the list is emptied)."""
        out = list(self.calls)
        self.calls.clear()
        return out

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)


def head_size(model) -> int:
    """D = V · d, the length of a flattened LM-head gradient."""
    w = model.get_output_embeddings().weight
    return w.numel()


def outer_sum(dz: torch.Tensor, h: torch.Tensor, owner: torch.Tensor, n_owner: int) -> torch.Tensor:
    """Σ over the rows of each owner of Σ_positions dz ⊗ h: dz [n, m, V], h [n, m, d], owner [n] long in
    0..n_owner−1 -> [n_owner, V·d] float64 (the flattened W gradient of each owner)."""
    per_row = torch.einsum("nmv,nmd->nvd", dz.double(), h.double()).reshape(dz.shape[0], -1)  # [n, V·d]
    out = torch.zeros(n_owner, per_row.shape[1], dtype=torch.float64)
    return out.index_add_(0, owner, per_row)


def leaf(z: torch.Tensor) -> torch.Tensor:
    """A grad-requiring copy of recorded logits (the variable the terms are differentiated by)."""
    return z.detach().clone().requires_grad_(True)


def logit_grad(value: torch.Tensor, z: torch.Tensor, retain: bool = False) -> torch.Tensor:
    """∂(Σ value)/∂z for a leaf z (zeros where value does not depend on z)."""
    (g,) = torch.autograd.grad(value.sum(), z, retain_graph=retain, allow_unused=True)
    return torch.zeros_like(z) if g is None else g
