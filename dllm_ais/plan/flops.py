"""FLOPs of the forwards (and backwards) of one RL step: matrix multiplies only (elementwise work is left to the
measured rates).

One forward of `rows` sequences, each feeding `tokens` query tokens that attend over `keys` positions, with the LM
head over `head` positions per row:
    2 · tokens · N_block  +  4 · tokens · keys · d · layers  +  2 · head · d · V        (per row)
N_block = the block linears' parameters (4d² + 3dh per layer); the attention term is QKᵀ and A·V (2·tokens·keys·d
each per layer). Backward: the linears twice over (input and weight gradients) for full fine-tuning, once (input
gradient; the frozen weights need none) plus the adapters' own work under LoRA; attention's backward counts twice
its forward; with gradient checkpointing the blocks' forward runs again, and a checkpointed policy-likelihood
call (every estimator but one_step) runs its whole forward again.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shape import ModelShape
from .workload import Pass, Workload


@dataclass(frozen=True)
class PassCost:
    """FLOPs of one Pass over the step."""

    passes: Pass
    """The forwards counted."""
    forward_flops: float
    """Forward FLOPs of all its calls."""
    backward_flops: float
    """Backward FLOPs (train passes only; checkpointing's recomputed forward included)."""

    @property
    def flops(self) -> float:
        return self.forward_flops + self.backward_flops


def forward_parts(shape: ModelShape, tokens: int, keys: int, head: int) -> tuple[float, float, float]:
    """(linear, attention, head) FLOPs of one row's forward."""
    linear = 2 * tokens * shape.params_block_linear
    attention = 4 * tokens * keys * shape.d_model * shape.n_layers
    lm_head = 2 * head * shape.d_model * shape.vocab
    return linear, attention, lm_head


def forward_flops(shape: ModelShape, rows: int, tokens: int, keys: int | None = None, head: int | None = None) -> float:
    """FLOPs of one forward of `rows` rows (keys default to tokens, the head to every token)."""
    return rows * sum(forward_parts(shape, tokens, tokens if keys is None else keys, tokens if head is None else head))


def pass_cost(shape: ModelShape, p: Pass, w: Workload) -> PassCost:
    """Forward (and for a train pass, backward) FLOPs of every call of `p`."""
    linear, attention, lm_head = (p.calls * p.rows * x for x in forward_parts(shape, p.tokens, p.keys, p.head))
    forward = linear + attention + lm_head
    if not p.grad:
        return PassCost(p, forward, 0.0)
    if w.lora_r:
        adapters = 2 * p.calls * p.rows * p.tokens * w.lora_r * shape.lora_in_out  # A then B, per token
        forward += adapters
        backward = linear + 2 * attention + lm_head + 2 * adapters
    else:
        backward = 2 * linear + 2 * attention + 2 * lm_head
    if p.recompute:  # the checkpointed call runs its whole forward again in backward
        backward += forward
    elif w.gradient_checkpointing:
        backward += linear + attention
    return PassCost(p, forward, backward)
