"""Batched autoregressive sampling with a KV cache that records the exact log-prob of every sampled token.

Two engines behind `ar_sample`: the compact rollout model (models/qwen/rollout.py) runs on the static-cache,
graph-capturable sampler of `samplers/ar_static.py`; any other causal LM runs the loop below.
One prefill forward over the left-padded prompts, then one single-token forward per new token with a transformers
`DynamicCache`. Position ids count real tokens only (left padding shifts nothing), and padded key positions are
masked, so a row's tokens do not depend on how much padding its batch needed.

Which distribution is sampled, and what is recorded (`logp_rollout`). For logits z (float64) at one position:
  T > 0:  π(v) ∝ exp(z_v / T) restricted to the kept set K and renormalised over K, where
            K = {v : z_v ≥ k-th largest z}        (top_k > 0; ties at the k-th value are all kept), then
            K = smallest prefix of K in descending-probability order whose renormalised mass reaches top_p
                (top_p < 1; the most likely token is always kept).
          The token is drawn from π (Gumbel-max on log π) and log π(token) is recorded: the log-prob under the
          distribution ACTUALLY sampled from, truncated and renormalised. This is the behaviour policy μ an
          importance weight needs; with top_k/top_p active it differs from the plain tempered softmax that a trainer
          recomputes (tokens outside K have μ = 0), so keep top_k = 0, top_p = 1 for unbiased RL rollouts.
  T = 0:  greedy (argmax z; top_k/top_p must stay off); the recorded value is log softmax(z)(token), the model's own
          untempered (T = 1) log-prob, since the point mass actually sampled carries no information.
`sampling_logprobs` computes log π from any logits, so a teacher-forced forward can recompute μ exactly.
"Exact" means: the log-prob of the forward that made the decision (cached, incremental). A teacher-forced forward of
the same model agrees to float32 rounding (~1e-6); in bf16 the two differ by bf16 noise, and the recorded value is the
one that was sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dllm_ais.progress import progress_bar
from dllm_ais.types import Rollout

from .ar_common import ARSamplerConfig, check_prompts, sample_tokens, sampling_logprobs


@torch.no_grad()
def ar_sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: ARSamplerConfig,
    stop_token_ids: Sequence[int],
    generator: torch.Generator | None = None,
    progress: bool = False,
    pad_token_id: int | None = None,
) -> Rollout:
    """Generate up to `config.max_new_tokens` tokens after each left-padded prompt, recording exact log-probs.

    model: a `dllm_ais.models.qwen.rollout.QwenRollout` (BF16 or FP8 fused copy) goes to the static-cache sampler
    (`samplers/ar_static.py`: same contract, same tokens and log-probs for the same logits and generator); anything
    else is a transformers causal LM (or its quantize_model FP8 copy) callable as model(input_ids, attention_mask,
    position_ids, past_key_values, use_cache, logits_to_keep) -> .logits. prompt_ids/prompt_mask [B, P].
    stop_token_ids: a row is finished after emitting one of them; finished rows are fed `pad_token_id` (default: the
    first stop token), get completion_mask False and logp 0, and decoding stops once every row has finished (the rest
    of [B, L] is padding).
    generator: explicit RNG for the sampling noise (on the model's device); the global RNG is never touched when one
    is given (None at T > 0 falls back to torch's global RNG, as torch.rand does).
    Returns a Rollout with completion_ids/completion_mask/commit_step/logp_rollout [B, L = max_new_tokens] and
    num_steps = forward passes made (= tokens decoded per row, prefill included).
    """
    from dllm_ais.models.qwen.rollout import QwenRollout

    if isinstance(model, QwenRollout):
        from .ar_static import static_ar_sample

        return static_ar_sample(model, prompt_ids, prompt_mask, config, stop_token_ids, generator=generator,
                                progress=progress, pad_token_id=pad_token_id)
    from transformers import DynamicCache

    check_prompts(prompt_ids, prompt_mask)
    stops = list(stop_token_ids)
    if not stops:
        raise ValueError("stop_token_ids is empty: pass at least the EOS id.")
    pad = stops[0] if pad_token_id is None else pad_token_id
    B, _ = prompt_ids.shape
    L, device = config.max_new_tokens, prompt_ids.device
    prompt_mask = prompt_mask.bool()
    stop_ids = torch.tensor(stops, device=device)

    completion = torch.full((B, L), pad, dtype=prompt_ids.dtype, device=device)
    mask = torch.zeros(B, L, dtype=torch.bool, device=device)
    logp_rollout = torch.zeros(B, L, dtype=torch.float32, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)

    attn = prompt_mask.long()  # [B, P + t], grows by one column per step
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # [B, P]: real tokens count 0, 1, ...; padding gets 0
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    next_pos = pos[:, -1:] + 1  # [B, 1]
    num_steps = 1
    bar = progress_bar(total=L, enabled=progress, desc="decoding", unit="tok", leave=False)
    for t in range(L):
        logp = sampling_logprobs(out.logits[:, -1], config)  # [B, V] float64
        token = sample_tokens(logp, config.temperature == 0, generator)  # [B]
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)  # [B]
        completion[:, t] = torch.where(done, pad, token)
        logp_rollout[:, t] = torch.where(done, 0.0, token_logp).float()
        mask[:, t] = ~done
        done = done | torch.isin(completion[:, t], stop_ids)
        bar.update(1)
        if t == L - 1 or bool(done.all()):
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=completion[:, t:t + 1], attention_mask=attn, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        next_pos = next_pos + 1
        num_steps += 1
    bar.close()
    commit_step = torch.arange(L, device=device).expand(B, L).clone()
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion, completion_mask=mask,
                   commit_step=commit_step, num_steps=num_steps, logp_rollout=logp_rollout)

