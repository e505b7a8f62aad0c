"""The logits a masked-diffusion sampler used at a recorded step, recomputed under any model (with gradients or not).

The sampler (samplers/diffusion.py) commits token y_j at step t(j) = `Rollout.commit_step[j]`; the canvas of step t
is the prompt plus the completion tokens with commit_step < t (every other position, and a never-committed one (−1),
a mask). What the step's logits were depends on the sampler's cache (SamplerConfig.cache):
- `none`: a full forward of canvas_t (with classifier-free guidance: the guided combination, as the sampler).
- `prefix` / `dual`: the step's block was opened by a *refresh* step t0 (the row's first commit in the block: every
  row commits at a refresh) whose full forward of canvas_t0 wrote the K/V of every position; step t0's logits are
  that forward's. A later step's logits come from a window forward of canvas_t — [block start, end) for `prefix`,
  the block for `dual` — whose fresh K/V overwrite the window's slots while every other position keeps its refresh
  K/V (Fast-dLLM's approximation, reproduced here under the replayed model, so the gradient flows through the cached
  K/V too).

`step_logits` returns, for n (row, step) pairs, the logits at requested positions of each step's block. Refresh
forwards are shared by the steps of one (row, block) in a call. The cache is the sampler's (models/kv_cache.py): one
tensor per layer, so writing it layer by layer in place under autograd is allowed.
"""

from __future__ import annotations

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.types import Rollout


def canvases(rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, mask_token_id: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Canvas ids and attention mask [n, P + L] of (rows[i], steps[i]): prompt + tokens committed before the step."""
    completion = rollout.completion_ids[rows]  # [n, L]
    cs = rollout.commit_step[rows]  # [n, L]
    before = (cs >= 0) & (cs < steps[:, None])  # a never-committed position (−1) stays masked
    canvas = torch.where(before, completion, torch.full_like(completion, mask_token_id))
    ids = torch.cat([rollout.prompt_ids[rows], canvas], dim=1)
    attn = torch.cat([rollout.prompt_mask[rows].bool(), torch.ones_like(canvas, dtype=torch.bool)], dim=1)
    return ids, attn


def step_blocks(commit_step: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor, block_length: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(block [n], refresh step t0 [n]) of each (row, step) that committed something: the block of its commits and
    the row's first commit step in that block. commit_step [B, L]."""
    cs = commit_step[rows]  # [n, L]
    n, L = cs.shape
    first = (cs == steps[:, None]).int().argmax(-1)  # [n] a position committed at the step
    block = first // block_length
    in_block = cs.view(n, L // block_length, block_length)[torch.arange(n, device=cs.device), block]  # [n, Lb]
    big = torch.iinfo(cs.dtype).max
    t0 = torch.where(in_block >= 0, in_block, big).min(-1).values
    return block, t0


def _plain_logits(model, ids, attn, positions, prompt_mask, cfg_scale: float, mask_token_id: int) -> torch.Tensor:
    """Full forwards: logits [n, m, V] at canvas positions [n, m]; with CFG the sampler's guided combination."""
    logits = model(input_ids=ids, attention_mask=attn, positions=positions).logits.float()
    if cfg_scale > 0:
        uncond = ids.clone()
        P = prompt_mask.shape[1]
        uncond[:, :P][prompt_mask] = mask_token_id
        un = model(input_ids=uncond, attention_mask=attn, positions=positions).logits.float()
        logits = un + (cfg_scale + 1) * (logits - un)
    return logits


def step_logits(model, rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, offsets: torch.Tensor,
                config: SamplerConfig, mask_token_id: int) -> torch.Tensor:
    """Logits [n, m, V] (float32, as the sampler casts them) the sampler `config` used at step steps[i] of row
    rows[i], at block-relative positions offsets [n, m] (< block_length) of the step's block (module docstring).
    rows, steps [n] long."""
    P = rollout.prompt_ids.shape[1]
    Lb = config.block_length
    block, t0 = step_blocks(rollout.commit_step, rows, steps, Lb)
    if config.cache == "none":
        ids, attn = canvases(rollout, rows, steps, mask_token_id)
        return _plain_logits(model, ids, attn, P + block[:, None] * Lb + offsets, rollout.prompt_mask[rows].bool(),
                             config.cfg_scale, mask_token_id)
    if config.cfg_scale > 0:
        raise ValueError("classifier-free guidance with a KV cache: the sampler refuses it, so there is no such "
                         "rollout to replay; use --cache none or --cfg-scale 0.")
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for b in torch.unique(block).tolist():
        sel = (block == b).nonzero().squeeze(-1)  # [s] indices into the n pairs
        r, t, start = rows[sel], steps[sel], t0[sel]
        lo = P + b * Lb  # canvas coordinates of the block
        uniq, inv = torch.unique(r, return_inverse=True)  # one refresh per row of this block
        first_t0 = torch.zeros_like(uniq).scatter_(0, inv, start)
        ids0, attn0 = canvases(rollout, uniq, first_t0, mask_token_id)
        cache = KVCache.for_model(model, uniq.numel(), ids0.shape[1])
        refresh = model(input_ids=ids0, attention_mask=attn0, positions=slice(lo, lo + Lb), kv_cache=cache,
                        window_start=0).logits.float()  # [u, Lb, V]
        at_refresh = t == start
        if bool(at_refresh.any()):
            pick = inv[at_refresh]
            idx = offsets[sel[at_refresh]]  # [a, m]
            out.append((sel[at_refresh], refresh[pick].gather(1, idx[..., None].expand(-1, -1, refresh.shape[-1]))))
        later = ~at_refresh
        if bool(later.any()):
            ids, attn = canvases(rollout, r[later], t[later], mask_token_id)
            window = ids[:, lo:] if config.cache == "prefix" else ids[:, lo:lo + Lb]
            logits = model(input_ids=window, attention_mask=attn, positions=offsets[sel[later]],
                           kv_cache=cache.rows(inv[later]), window_start=lo).logits.float()  # [l, m, V]
            out.append((sel[later], logits))
    order = torch.cat([i for i, _ in out])
    stacked = torch.cat([x for _, x in out])
    return stacked[torch.argsort(order)]
