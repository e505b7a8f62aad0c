"""EBPO's composite ELBO for SDAR: the block-wise ELBO's per-cell law, every counted block masked in every draw, the
noise stratified over all (draw, block) cells of a sequence from one cyclic offset (`--policy-logprob ebpo`).

Anchor: DARE, yjyddq/DARE@83ae8a3. `_forward_process_ebpo` (verl/trainer/ppo/dllm_core_algos.py:708-800) is called
once per sequence with n_l copies of it (verl/workers/dllm_fsdp_workers.py:1178-1210; every EBPO recipe has
n_l = mc_num, 16 for SDAR), so for a sequence with N_b blocks that hold response tokens ("global" block origin, the
compact prompt + response grid: dllm_fsdp_workers.py:268-278 — the grid of our `block_canvas`) and K draws:

    cells c = k · N_b + j (draw k, j-th counted block; dllm_core_algos.py:786-791's loop order), N = K · N_b
    t_c   = (U + c / N) mod 1,  U ~ U[0, 1) once per sequence                  (:765-773, float32)
    l_c   = min(floor(t_c · n_j) + 1, n_j),  n_j the block's response tokens   (:792)
    S_c   = a uniform subset of l_c of the block's response tokens              (:793-796, randperm)
    token term at j ∈ S_c: log p_θ(y_j | x_t block, clean blocks before) · n_j / l_c   (p_mask = l/n, :797; SDAR's
          model divides the cross-entropy by it: models/SDAR-*/modeling_sdar.py:1222-1226)
    composite ELBO = (1/K) Σ_k Σ_j Σ_{i ∈ S_kj} (n_j / l_kj) log p_θ(y_i | ...)
          (sdar_dp_actor_ebpo.py:66-80, ebpo_actor_mixin.py:46-56 → compute_ebpo_composite_elbo :802-843)

Each t_c is exactly U[0, 1), so l_c is exactly U{1..n_j} and the weight n_j / l_c: per cell the law of our block-wise
ELBO (models/sdar/likelihood.py), whose every draw also masks every counted block. What differs is the coupling: the
block-wise ELBO stratifies each block over its K draws from its own offset; EBPO stratifies the K · N_b cells of a
sequence together from one offset (with equal blocks of n | K · N_b every count 1..n occurs exactly K · N_b / n times
per sequence). Unbiased either way; the draws differ in variance only.

The ratio EBPO trains on is the sequence ratio exp(ELBO_θ − ELBO_old) of the composite ELBOs on the same draws,
clipped once per sequence (compute_policy_loss_ebpo, dllm_core_algos.py:153-226, the mean over sequences):
GRPOConfig.importance_sampling_level = "sequence_sum" on the per-token terms returned here (their sum is the
composite ELBO), with loss_type grpo for its per-sequence mean.

Choices where DARE leaves room (each stated in docs/likelihoods.md): the offset and the subsets come from an explicit
torch.Generator, offsets for the whole batch first (one float32 uniform per sequence, in row order: for one sequence
the offset, hence every l_c, equals DARE's under the same seed) then the subsets as ranks of uniforms (the law of
randperm's first l, not its stream); float32 for t and l as DARE. Rows after a stop are never masked or scored.
"""

from __future__ import annotations

import torch


def counted_blocks(counted: torch.Tensor, block_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """counted [B, T] bool (T a multiple of block_length) -> (n [B, nb] long: counted slots per block, cell [B, nb]
    long: the block's index among the row's blocks that hold a counted slot, −1 for the others, N_b [B] long: their
    number)."""
    B, T = counted.shape
    n = counted.view(B, T // block_length, block_length).sum(-1)  # [B, nb]
    active = n > 0
    cell = torch.where(active, active.long().cumsum(-1) - 1, -1)  # [B, nb]
    return n, cell, active.sum(-1)


def noise_levels(offset: torch.Tensor, cell: torch.Tensor, num_blocks: torch.Tensor, num_draws: int) -> torch.Tensor:
    """t [B, K, nb] float32: (U_b + (k · N_b + j) / (K · N_b)) mod 1 for draw k and counted block j (DARE's cyclic
    offset, dllm_core_algos.py:768-773, in its float32 arithmetic). offset [B] float32, cell [B, nb] and num_blocks
    [B] from `counted_blocks`; cells of uncounted blocks (cell −1) get a value that is never used."""
    k = torch.arange(num_draws, device=cell.device)[None, :, None]  # [1, K, 1]
    N = (num_draws * num_blocks).clamp(min=1)[:, None, None]  # [B, 1, 1]
    c = k * num_blocks[:, None, None] + cell[:, None, :].clamp(min=0)  # [B, K, nb]
    return (offset.float()[:, None, None] + c.float() / N.float()) % 1.0


def mask_counts(t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """l [B, K, nb] long: min(floor(t · n) + 1, n) (dllm_core_algos.py:792), 0 where the block counts nothing.
    t [B, K, nb] float32, n [B, nb] long."""
    nk = n[:, None, :].expand_as(t)  # [B, K, nb]
    l = (t * nk.float()).floor().long() + 1
    return torch.minimum(l, nk)


def draw_ebpo_masks(counted: torch.Tensor, block_length: int, num_draws: int, generator: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO's draw (module docstring). counted [B, T] bool (T a multiple of block_length) -> (mask [B, K, T] bool,
    weight [B, K, T] float64: n_j / l_kj on the block's slots). Draws, in order: the B offsets, then the subsets."""
    B, T = counted.shape
    K, Lb, dev = num_draws, block_length, counted.device
    nb = T // Lb
    n, cell, blocks = counted_blocks(counted, Lb)
    offset = torch.rand(B, generator=generator, device=dev)  # [B] float32: U per sequence
    l = mask_counts(noise_levels(offset, cell, blocks, K), n)  # [B, K, nb]
    c = counted.view(B, 1, nb, Lb).expand(B, K, nb, Lb)
    keys = torch.rand(B, K, nb, Lb, generator=generator, device=dev).masked_fill(~c, 2.0)  # uncounted rank last
    rank = keys.argsort(-1).argsort(-1)  # [B, K, nb, Lb]
    mask = c & (rank < l[..., None])
    return mask.reshape(B, K, T), cell_weights(mask.reshape(B, K, T), counted, Lb)


def cell_weights(mask: torch.Tensor, counted: torch.Tensor, block_length: int) -> torch.Tensor:
    """weight [B, K, T] float64: n_j / l_kj on every slot of block j in draw k (l_kj: its masked counted slots; 1/p_mask
    of DARE's token loss), 0 where the draw masks nothing in the block. mask [B, K, T], counted [B, T] bool."""
    B, K, T = mask.shape
    nb = T // block_length
    m = (mask & counted[:, None, :]).view(B, K, nb, block_length).sum(-1).double()  # [B, K, nb] l
    n = counted.view(B, 1, nb, block_length).sum(-1).double()  # [B, 1, nb]
    w = torch.where(m > 0, n / m.clamp(min=1), 0.0)  # [B, K, nb]
    return w[..., None].expand(B, K, nb, block_length).reshape(B, K, T)


def composite_terms(logp: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[B, T] per-slot terms of the composite ELBO: mean over the K draws of weight · log p at the draw's masked
    slots; Σ over slots = the composite ELBO. logp, weight [B, K, T] (logp: log p_θ of the clean token given draw k's
    canvas), mask [B, K, T] bool."""
    return torch.where(mask, logp * weight.to(logp.dtype), 0.0).mean(1)


def ebpo_token_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, block_length: int,
                    gen_length: int, num_draws: int, generator: torch.Generator, mask_token_id: int,
                    rows: torch.Tensor | None = None) -> torch.Tensor:
    """[B, L] (or [len(rows), L]) per-token terms of EBPO's composite ELBO on the completion layout: one two-stream
    [x_t | x_0] forward per draw (models/sdar/likelihood.py); the draw is made for the whole batch, then `rows`
    taken, so a micro-batch sees the masks the full batch does."""
    from dllm_ais.models.sdar.likelihood import block_elbo_token_logp

    return block_elbo_token_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                 block_length=block_length, gen_length=gen_length, num_draws=num_draws,
                                 generator=generator, mask_token_id=mask_token_id, rows=rows, draw=draw_ebpo_masks)
