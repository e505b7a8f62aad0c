"""Masked-diffusion sampling with LLaDA's `generate` semantics: one sampler for BF16 and FP8 models alike.

canvas = [left-padded prompt | MASK × gen_length]. The completion is split into blocks filled left to right
(semi-autoregressive); each block gets steps / num_blocks denoising steps. At every step the model sees the whole
canvas; each masked position of the current block proposes a token (Gumbel-max in float64 at temperature T, argmax at
T = 0), and the k most confident proposals are committed, where k follows an even split of the block's masked count
over its steps (the remainder goes to the first steps).

Two departures from LLaDA's reference `generate`, neither changing what a trained model samples: logits are computed
only for the current block (the others cannot be committed; this cuts the LM head's cost and the float64 buffers by
the number of blocks), and the mask token is never proposed (the reference can commit a mask id, which then stays in
the completion). The confidence of a proposal is its probability under the full softmax, mask token included, as in
the reference: excluding the mask only from the proposal keeps near-ties ordered as the reference orders them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.progress import progress_bar
from dllm_ais.types import Rollout


def transfer_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit per step: num_masked [B] -> [B, steps], rows summing to num_masked (remainder first)."""
    base = num_masked // steps  # [B]
    rem = num_masked % steps  # [B]
    extra = torch.arange(steps, device=num_masked.device)[None, :] < rem[:, None]  # [B, steps]
    return base[:, None] + extra.long()


def propose_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Sample a token per position from softmax(logits / T) by Gumbel-max in float64; argmax at T = 0.

    logits [B, L, V] -> tokens [B, L]. Same distribution as LLaDA's exp(logits) / (-log u)^T, without overflow.
    """
    logits = logits.to(torch.float64)
    if temperature == 0:
        return logits.argmax(-1)
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
    return (logits + temperature * gumbel).argmax(-1)


def commit_mask(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row, True at the k[b] highest-confidence positions. confidence [B, L] (−inf = not eligible), k [B]."""
    order = confidence.argsort(dim=-1, descending=True, stable=True)  # [B, L]
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return ranks < k[:, None]


def completion_mask_from_stops(completion: torch.Tensor, stop_token_ids: Sequence[int]) -> torch.Tensor:
    """[B, L] bool: True up to and including the first stop token of each row (all True if none)."""
    is_stop = torch.isin(completion, torch.tensor(list(stop_token_ids), device=completion.device))
    stops_before = is_stop.long().cumsum(-1) - is_stop.long()  # stops strictly before each position
    return stops_before == 0


def _logits(model, x: torch.Tensor, attention_mask: torch.Tensor, lo: int, hi: int, compiled: bool = False
            ) -> torch.Tensor:
    """Logits [B, hi - lo, V] (float32) of canvas positions lo:hi.

    compiled: through the one compiled step function, with the positions as an index tensor so every block reuses
    the same graph (and CUDA graph); the output is copied out of the graph's memory before the next replay."""
    if not compiled:
        return model(input_ids=x, attention_mask=attention_mask, positions=slice(lo, hi)).logits.float()
    positions = torch.arange(lo, hi, device=x.device).expand(x.shape[0], -1)  # [B, hi - lo]
    torch.compiler.cudagraph_mark_step_begin()  # each step is a new CUDA-graph generation (outputs copied out)
    return _compiled_step()(model, x, attention_mask, positions).to(torch.float32, copy=True)


def _step(model, x: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, attention_mask=attention_mask, positions=positions).logits


@functools.cache
def _compiled_step():
    """torch.compile of _step (the model is an argument, so one cache serves every model, guarded per model)."""
    return torch.compile(_step, mode="reduce-overhead", dynamic=False)


@torch.no_grad()
def diffusion_sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: SamplerConfig,
    mask_token_id: int,
    stop_token_ids: Sequence[int],
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> Rollout:
    """Generate `config.gen_length` tokens after each left-padded prompt.

    model: callable as model(input_ids, attention_mask, positions) -> object with .logits [B, T', V] (LLaDAModelLM or
    its FP8 copy). prompt_ids/prompt_mask [B, P]. generator: explicit RNG for Gumbel noise and random remasking.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes.")
    B, P = prompt_ids.shape
    L, device = config.gen_length, prompt_ids.device
    prompt_mask = prompt_mask.bool()
    x = torch.cat([prompt_ids, torch.full((B, L), mask_token_id, dtype=prompt_ids.dtype, device=device)], dim=1)
    attn = torch.cat([prompt_mask, torch.ones(B, L, dtype=torch.bool, device=device)], dim=1)  # [B, P + L]
    commit_step = torch.full((B, L), -1, dtype=torch.long, device=device)
    steps_per_block = config.steps // config.num_blocks
    compiled = config.compile and device.type == "cuda"
    bar = progress_bar(total=config.steps, enabled=progress, desc="denoising", unit="step", leave=False)
    step = 0
    for b in range(config.num_blocks):
        lo, hi = b * config.block_length, (b + 1) * config.block_length  # completion coordinates
        schedule = transfer_schedule((x[:, P + lo:P + hi] == mask_token_id).sum(-1), steps_per_block)  # [B, S]
        for i in range(steps_per_block):
            # Only the current block can be committed, so only its logits are computed (LM head cost / num_blocks).
            masked = x[:, P + lo:P + hi] == mask_token_id  # [B, Lb]
            logits = _logits(model, x, attn, P + lo, P + hi, compiled)  # [B, Lb, V]
            if config.cfg_scale > 0:
                uncond = x.clone()
                uncond[:, :P][prompt_mask] = mask_token_id
                un_logits = _logits(model, uncond, attn, P + lo, P + hi, compiled)
                logits = un_logits + (config.cfg_scale + 1) * (logits - un_logits)
            if config.remasking == "low_confidence":  # confidence from the full softmax, mask token included
                probs = torch.softmax(logits.to(torch.float64), dim=-1)  # [B, Lb, V]
            logits[..., mask_token_id] = -torch.inf  # never propose the mask token (the proposal only)
            proposal = propose_tokens(logits, config.temperature, generator)  # [B, Lb]
            if config.remasking == "low_confidence":
                confidence = probs.gather(-1, proposal[..., None]).squeeze(-1)  # [B, Lb]
            else:
                confidence = torch.rand(masked.shape, generator=generator, device=device, dtype=torch.float64)
            confidence = torch.where(masked, confidence, -torch.inf)
            commit = commit_mask(confidence, schedule[:, i]) & masked  # [B, Lb]
            block = x[:, P + lo:P + hi]
            x[:, P + lo:P + hi] = torch.where(commit, proposal.to(x.dtype), block)
            commit_step[:, lo:hi][commit] = step
            step += 1
            bar.update(1)
    bar.close()
    completion = x[:, P:]
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion,
                   completion_mask=completion_mask_from_stops(completion, stop_token_ids), commit_step=commit_step,
                   num_steps=step)

