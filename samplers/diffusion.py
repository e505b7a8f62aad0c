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

Fast-dLLM (NVlabs/Fast-dLLM `llada/generate.py`), one loop for every rollout copy:
- `cache="prefix"`: a block's first step is a full forward that writes the K/V of every position into a
  preallocated cache (models/kv_cache.py) and commits with the block's first scheduled count; its later steps feed
  the canvas from the block start on and attend to the cached prefix plus the fresh K/V of what they feed
  (`generate_with_prefix_cache`). `cache="dual"`: later steps feed only the current block, overwriting its cache slots
  and attending over every cached position (`generate_with_dual_cache`, `replace_position`).
- `threshold`: each step commits every masked position of the block whose confidence >= threshold and at least the
  most confident one (`get_transfer_index`); a block ends when it has no mask left. Rows move block by block
  together; a row whose block is full waits without committing. With a cache at least one cached step follows the
  refresh, as in Fast-dLLM (its NFE counts it). With threshold None the fixed schedule runs steps / num_blocks
  forwards per block (Fast-dLLM's loops stop a block early only when steps / num_blocks > block_length).
- NFE = forward calls (`Rollout.nfe` = `num_steps`); `commit_step` is the global forward index, so the canvas the
  model saw at step t is the prompt plus the tokens with commit_step < t (with a cache, the logits of that step came
  from the cached forward: that is the approximation the trajectory ratio measures). `logp_rollout` records log μ of
  each committed token at its step (`likelihood.logprobs.proposal_logprobs` on the logits already there).
Compiled sampling (CUDA, or DLLM_AIS_COMPILE_CPU=1) pads prompts to multiples of PROMPT_BUCKET so a run keeps one
graph per window shape, and warns if dynamo gives up. SamplerConfig.cuda_graphs (on CUDA by default) captures each
static-shape forward once as a CUDA graph and replays it (samplers/diffusion_graphs.py), eager or compiled.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.selection import transfer_schedule  # noqa: F401 (re-exported: the sampler's schedule)
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.progress import progress_bar
from dllm_ais.types import Rollout

from . import cuda_graphs, diffusion_graphs
from .diffusion_graphs import model_step as _step


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


def threshold_commit(confidence: torch.Tensor, masked: torch.Tensor, threshold: float,
                     max_commit: int | torch.Tensor | None = None) -> torch.Tensor:
    """Fast-dLLM's threshold rule: per row, every masked position with confidence >= threshold (equality commits:
    Fast-dLLM drops a token only when its confidence < threshold), and always the most confident masked one (none if
    the row has no mask left). confidence [B, L] (−inf off `masked`), masked [B, L]. max_commit N (an int, or [B]
    per row): of the positions at or above the threshold only the N most confident (lower position first on a tie,
    as `commit_mask`)."""
    top = torch.zeros_like(masked)
    top.scatter_(1, confidence.argmax(-1, keepdim=True), True)  # first maximum, like a stable sort
    above = masked & (confidence >= threshold)  # [B, L]
    if max_commit is not None:
        k = torch.as_tensor(max_commit, dtype=torch.long, device=above.device).expand(above.shape[0])
        above &= commit_mask(torch.where(above, confidence, -torch.inf), k)
    return masked & (above | top)


PROMPT_BUCKET = 64
"""Compiled sampling left-pads prompts to a multiple of this, so one graph (and CUDA graph) serves every batch of a
run whose padded prompt length is the same (positions skip padding, keys on padding are masked)."""


def pad_prompts_to_bucket(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, pad_id: int,
                          bucket: int = PROMPT_BUCKET) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad [B, P] prompts (ids with pad_id, mask with False) to P' = the next multiple of `bucket`."""
    P = prompt_ids.shape[1]
    extra = -(-P // bucket) * bucket - P
    if extra == 0:
        return prompt_ids, prompt_mask
    B = prompt_ids.shape[0]
    ids = torch.cat([prompt_ids.new_full((B, extra), pad_id), prompt_ids], dim=1)
    return ids, torch.cat([prompt_mask.new_zeros(B, extra), prompt_mask], dim=1)


def forward_rows(batch: int, prompt_len: int, config: SamplerConfig) -> list[int]:
    """Activation rows M (= batch × tokens) of every model call diffusion_sample makes for [batch, prompt_len]
    prompts: the whole canvas; with the prefix cache each block's window (block to the end); with the dual cache the
    block window. The GEMM shapes a rollout copy must be ready for (fp8.backends.prepare_gemm_shapes)."""
    canvas = prompt_len + config.gen_length
    rows = {batch * canvas}
    if config.cache == "prefix":
        rows |= {batch * (config.gen_length - b * config.block_length) for b in range(config.num_blocks)}
    elif config.cache == "dual":
        rows.add(batch * config.block_length)
    return sorted(rows)


def _compile_on_cpu() -> bool:
    """Test hook: DLLM_AIS_COMPILE_CPU=1 compiles the sampler's step on CPU too (inductor, mode="default")."""
    return os.environ.get("DLLM_AIS_COMPILE_CPU") == "1"


def _logits(model, x: torch.Tensor, attention_mask: torch.Tensor, lo: int, hi: int, compiled: int = 0,
            kv_cache: KVCache | None = None, window_start: int = 0,
            graphs: diffusion_graphs.SamplerGraphs | None = None) -> torch.Tensor:
    """Logits [B, hi - lo, V] (float32) of input positions lo:hi.

    kv_cache None: x is the whole canvas. Else x is the window [window_start, window_start + Tw) of the canvas,
    attention_mask the whole canvas's, lo:hi window coordinates (the model writes the window's K/V into the cache).
    compiled: 0 = eager; n > 0 = through the one compiled step function, whose graphs a rollout needs n of per prompt
    bucket (full / refresh / one window shape per block for the prefix cache), with the positions (and the window
    start) as tensors so every block of a window shape reuses the same graph (and CUDA graph); the output is copied
    out of the graph's memory before the next replay. graphs: the call's CUDA-graph runner
    (samplers/diffusion_graphs.py) or None; it replays the (compiled or eager) step captured for this shape."""
    if graphs is not None:
        positions = torch.arange(lo, hi, device=x.device).expand(x.shape[0], -1)  # [B, hi - lo]
        start = torch.tensor(window_start, device=x.device)
        out = graphs.logits(model, x, attention_mask, positions, kv_cache, start)
        return out.to(torch.float32, copy=True)  # out of the graph's memory before the next replay
    if not compiled:
        extra = {} if kv_cache is None else dict(kv_cache=kv_cache, window_start=window_start)
        return model(input_ids=x, attention_mask=attention_mask, positions=slice(lo, hi), **extra).logits.float()
    positions = torch.arange(lo, hi, device=x.device).expand(x.shape[0], -1)  # [B, hi - lo]
    start = torch.tensor(window_start, device=x.device)
    if x.device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # each step is a new CUDA-graph generation (outputs copied out)
    return _run_compiled(model, x, attention_mask, positions, kv_cache, start, compiled).to(torch.float32, copy=True)


@functools.cache
def _compiled_step(device_type: str = "cuda", cudagraphs: bool = True):
    """torch.compile of _step (the model is an argument, so one cache serves every model, guarded per model).
    CUDA: mode="reduce-overhead" (CUDA graphs), or "default" when our own graphs capture it (cuda_graphs); CPU
    (tests): mode="default". dynamic=False: prompts are padded to PROMPT_BUCKET so a run's shapes repeat."""
    mode = "reduce-overhead" if device_type == "cuda" and cudagraphs else "default"
    return torch.compile(_step, mode=mode, dynamic=False)


_GAVE_UP: set[str] = set()
"""Device types where dynamo gave up (recompile limit hit): sampling there runs eager, warned once."""


def _run_compiled(model, x, attention_mask, positions, kv_cache, window_start, graphs: int = 1,
                  cudagraphs: bool = True) -> torch.Tensor:
    """The compiled step; if dynamo gives up (recompile limit hit) warn once and run eager from then on, never
    silently. Graph breaks found while compiling are reported as a warning too (they cost speed, not results).
    graphs: distinct graphs one prompt bucket needs; dynamo's recompile_limit is scaled by it (it then counts prompt
    buckets, not window shapes)."""
    device = x.device.type
    if device in _GAVE_UP:
        return _step(model, x, attention_mask, positions, kv_cache, window_start)
    breaks_before = sum(torch._dynamo.utils.counters["graph_break"].values())
    try:
        limit = torch._dynamo.config.recompile_limit * graphs
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=limit):
            out = _compiled_step(device, cudagraphs)(model, x, attention_mask, positions, kv_cache, window_start)
    except torch._dynamo.exc.FailOnRecompileLimitHit as err:
        _GAVE_UP.add(device)
        warnings.warn(f"diffusion_sample: torch.compile gave up ({err}); the sampler runs EAGER from now on. Use "
                      "fewer distinct shapes (prompt lengths are padded to multiples of "
                      f"{PROMPT_BUCKET}) or raise torch._dynamo.config.recompile_limit.", RuntimeWarning,
                      stacklevel=3)
        return _step(model, x, attention_mask, positions, kv_cache, window_start)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values()) - breaks_before
    if breaks:
        reasons = ", ".join(list(torch._dynamo.utils.counters["graph_break"])[:3])
        warnings.warn(f"diffusion_sample: the compiled step has {breaks} graph break(s) ({reasons}); it runs "
                      "partly eager (slower, same results).", RuntimeWarning, stacklevel=3)
    return out


def _want_graphs(model, mode: str, device: torch.device) -> bool:
    """SamplerConfig.cuda_graphs resolved for this call: 'on' off CUDA or on a model that is not an nn.Module (a
    graph reads weights by address, which only a module's parameters tell) is refused in one ValueError line; 'auto'
    there runs eager (with a warning for the non-module case)."""
    if not cuda_graphs.use_graphs(mode, device):
        return False
    if not isinstance(model, torch.nn.Module):
        why = f"the rollout model is a {type(model).__name__}, not an nn.Module (its weights' addresses are unknown)"
        if mode == "on":
            raise ValueError(f"cuda_graphs='on': {why}; pass --cuda-graphs auto or off.")
        warnings.warn(f"cuda_graphs='auto': {why}; sampling runs eager.", RuntimeWarning, stacklevel=3)
        return False
    return True


_graph_runner = diffusion_graphs.runner
"""Test hook: the CUDA-graph runner factory (tests inject cuda_graphs.eager_capture through it)."""


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
    record_selection: bool = False,
) -> Rollout:
    """Generate `config.gen_length` tokens after each left-padded prompt.

    model: callable as model(input_ids, attention_mask, positions[, kv_cache, window_start]) -> object with .logits
    [B, T', V] (LLaDAModelLM, its per-Linear FP8/FP4 copies, FusedLLaDA). prompt_ids/prompt_mask [B, P].
    generator: explicit RNG for Gumbel noise and random remasking.

    config.cache / config.threshold select Fast-dLLM's block KV cache and threshold decoding (module docstring).
    The Rollout records commit_step (global forward index of each commit: the canvas the model saw at step t is the
    prompt plus the tokens with commit_step < t), logp_rollout (log μ of each committed token under the proposal it
    was drawn from, `likelihood.logprobs.proposal_logprobs`), commit_confidence (low-confidence remasking: the
    confidence each token was committed with) and nfe (forward calls; CFG's second forward not counted).
    record_selection: also record logp_select, each step's selection log-term under the logits the step used
    (`likelihood.selection`; a float64 pass over the block's [B, Lb, V] probabilities per step).
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes.")
    if config.cache != "none" and config.cfg_scale > 0:
        raise ValueError(f"cfg_scale={config.cfg_scale} with cache={config.cache!r}: classifier-free guidance is not "
                         "supported with a KV cache; pass --cache none or --cfg-scale 0.")
    from dllm_ais.likelihood.logprobs import proposal_logprobs
    from dllm_ais.likelihood.selection import SelectionRule, selection_logprob

    orig_ids, prompt_mask = prompt_ids, prompt_mask.bool()
    device = prompt_ids.device
    graphed = _want_graphs(model, config.cuda_graphs, device)  # refuses 'on' here, before anything is allocated
    compiled = config.compile and (device.type == "cuda" or _compile_on_cpu())
    if compiled:  # graphs per prompt bucket: full (no cache) or refresh + window(s)
        compiled = 1 if config.cache == "none" else 1 + (config.num_blocks if config.cache == "prefix" else 1)
    if compiled or graphed:  # one graph per run: bucketed prompt length (left padding changes no real token's result)
        prompt_ids, prompt_mask = pad_prompts_to_bucket(prompt_ids, prompt_mask, mask_token_id)
    B, P = prompt_ids.shape
    L, Lb = config.gen_length, config.block_length
    x = torch.cat([prompt_ids, torch.full((B, L), mask_token_id, dtype=prompt_ids.dtype, device=device)], dim=1)
    attn = torch.cat([prompt_mask, torch.ones(B, L, dtype=torch.bool, device=device)], dim=1)  # [B, P + L]
    commit_step = torch.full((B, L), -1, dtype=torch.long, device=device)
    logp = torch.zeros(B, L, dtype=torch.float32, device=device)
    if (compiled or graphed) and isinstance(model, torch.nn.Module):  # GEMM backend decisions, before compiling
        from dllm_ais.fp8.backends import prepare_gemm_shapes

        prepare_gemm_shapes(model, forward_rows(B, P, config))
    low_conf = config.remasking == "low_confidence"
    confidence_record = torch.full((B, L), torch.nan, dtype=torch.float32, device=device) if low_conf else None
    select = torch.zeros(B, L, dtype=torch.float64, device=device) if record_selection else None
    rule = SelectionRule.of(config, mask_token_id)
    graphs = None
    if graphed:  # the step: compiled without inductor's own CUDA graphs, or eager
        step = functools.partial(_run_compiled, graphs=compiled, cudagraphs=False) if compiled else _step
        graphs = _graph_runner(model, config.cuda_graphs, B, P + L, config.cache, step, bool(compiled))
    kv_cache = None
    if config.cache != "none":
        kv_cache = graphs.kv_cache(model, B, P + L) if graphs else KVCache.for_model(model, B, P + L)
        if compiled and device.type == "cuda" and not graphs:
            kv_cache.mark_static()
    steps_per_block = config.steps // config.num_blocks
    total = config.steps if config.threshold is None else None
    bar = progress_bar(total=total, enabled=progress, desc="denoising", unit="step", leave=False)
    step = 0
    for b in range(config.num_blocks):
        lo, hi = P + b * Lb, P + (b + 1) * Lb  # canvas coordinates of the block
        schedule = transfer_schedule((x[:, lo:hi] == mask_token_id).sum(-1), steps_per_block)  # [B, S]
        i = 0
        while True:
            # Only the current block can be committed, so only its logits are computed (LM head cost / num_blocks).
            masked = x[:, lo:hi] == mask_token_id  # [B, Lb]
            if kv_cache is None:
                logits = _logits(model, x, attn, lo, hi, compiled, graphs=graphs)  # [B, Lb, V]
            elif i == 0:  # the block's refresh: a full forward that (re)writes every cached position
                logits = _logits(model, x, attn, lo, hi, compiled, kv_cache, 0, graphs)
            elif config.cache == "prefix":  # recompute the block and everything after it
                logits = _logits(model, x[:, lo:], attn, 0, Lb, compiled, kv_cache, lo, graphs)
            else:  # dual: recompute the current block only
                logits = _logits(model, x[:, lo:hi], attn, 0, Lb, compiled, kv_cache, lo, graphs)
            if config.cfg_scale > 0:
                uncond = x.clone()
                uncond[:, :P][prompt_mask] = mask_token_id
                un_logits = _logits(model, uncond, attn, lo, hi, compiled, graphs=graphs)
                logits = un_logits + (config.cfg_scale + 1) * (logits - un_logits)
            if select is not None and low_conf:  # before the mask token leaves the logits
                step_logits = logits.clone()
            if low_conf:  # confidence from the full softmax, mask token included
                probs = torch.softmax(logits.to(torch.float64), dim=-1)  # [B, Lb, V]
            logits[..., mask_token_id] = -torch.inf  # never propose the mask token (the proposal only)
            proposal = propose_tokens(logits, config.temperature, generator)  # [B, Lb]
            if low_conf:
                confidence = probs.gather(-1, proposal[..., None]).squeeze(-1)  # [B, Lb]
            else:
                confidence = torch.rand(masked.shape, generator=generator, device=device, dtype=torch.float64)
            confidence = torch.where(masked, confidence, -torch.inf)
            if config.threshold is None:
                commit = commit_mask(confidence, schedule[:, i]) & masked  # [B, Lb]
            else:
                commit = threshold_commit(confidence, masked, config.threshold, config.max_commit_per_step)
            x[:, lo:hi] = torch.where(commit, proposal.to(x.dtype), x[:, lo:hi])
            commit_step[:, lo - P:hi - P][commit] = step
            if confidence_record is not None:
                confidence_record[:, lo - P:hi - P][commit] = confidence[commit].float()
            if select is not None:  # the step's selection term, repeated on every token it committed
                term = selection_logprob(step_logits if low_conf else None, masked, commit, proposal, rule)  # [B]
                select[:, lo - P:hi - P] = torch.where(commit, term[:, None], select[:, lo - P:hi - P])
            # log μ of the committed tokens only (a few of the block's Lb rows: the log-softmax over V is the cost)
            logp[:, lo - P:hi - P][commit] = proposal_logprobs(logits[commit], proposal[commit], config.temperature,
                                                               mask_token_id).float()
            step += 1
            i += 1
            bar.update(1)
            if config.threshold is None:
                if i == steps_per_block:
                    break
            # Threshold: until the block has no mask; with a cache Fast-dLLM always runs one cached step after the
            # refresh (even when the refresh filled the block), which counts in its NFE and so in ours.
            elif not (x[:, lo:hi] == mask_token_id).any() and (kv_cache is None or i >= 2):
                break
    bar.close()
    completion = x[:, P:]
    return Rollout(prompt_ids=orig_ids, prompt_mask=prompt_mask[:, P - orig_ids.shape[1]:], completion_ids=completion,
                   completion_mask=completion_mask_from_stops(completion, stop_token_ids), commit_step=commit_step,
                   num_steps=step, logp_rollout=logp, nfe=step, logp_select=select,
                   commit_confidence=confidence_record)
