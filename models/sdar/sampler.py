"""Block-diffusion sampling with SDAR's `block_diffusion_generate` semantics (JetAstra/SDAR@c2041a8 generate.py:57-202)
and a native per-block KV cache; batched with left padding (the official generate is batch 1).

Per row, exactly the official loop (the law of a step — proposal, schedule, commit rule — is models/sdar/selection.py,
shared with the path likelihood):
- the canvas is the prompt followed by masks up to a whole number of blocks (generate.py:79-93); the prompt's full
  blocks are prefilled once into the cache (:95-106, one forward); a prompt tail is denoised as part of the first
  block (its slots are never masked, never drawn into);
- each block: up to `denoising_steps` forwards of the block against the cache (:131-196), each drawing every masked
  slot and committing by the strategy; once no mask is left, one more forward of the finished block stores its K/V
  for the blocks after it (:120-129, `store_kv=True`) — NFE counts every forward, the prefill and the store passes
  included, as the official loop makes them;
- after a block, a row whose completion holds a stop id stops (:199-200).
Batch: `block_canvas` (models/sdar/model.py) aligns every row's own blocks to the canvas's (left padding by whole
blocks), so all rows denoise the same canvas block together; a row whose block is full while another's is not waits
(its tokens, and so its K/V, do not change: what it computes equals its batch-1 run); a stopped row, or one whose own
canvas has ended (no prompt tail: one block fewer), is idle. The batch stops when every row has. The cache is causal
across blocks, so cached logits equal the uncached block-causal forward's (no approximation).

Departures from the official code: the mask token is never proposed (selection.py); a quota larger than the masks
left commits the masks only, never overwriting a prompt-tail or committed slot (selection.py says what the official
`topk` does there); exact confidence ties go to the lower slot; the proposal is computed in float32 whatever the
model's dtype (the official code works in the logits' dtype: bf16 confidences for a bf16 model).

Recorded (dllm_ais/types.py `Rollout`): the completion of row i is its canvas from its prompt's end to the end of its
last block (the official `x[:, prompt_length:]`: gen_length plus the slots that fill its last block), left-aligned in
[B, L], L the batch's longest; slots past a row's own canvas or after it stopped hold the mask token, commit_step −1
and completion_mask False. commit_step = the index of the batch's denoising forward that committed the token (the
prefill and store passes are not denoising steps; `Rollout.num_steps` counts the denoising forwards, `nfe` every
forward); logp_rollout = log q of the token under its step's filtered proposal (float32); commit_confidence = q of
the token; logp_select (record_selection) = the step's selection term, repeated on the tokens it committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dllm_ais.config import CUDA_GRAPH_MODES
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.sdar.model import block_canvas, padded_positions
from dllm_ais.models.sdar.selection import (
    STRATEGIES,
    SDARRule,
    commit_slots,
    proposal,
    proposal_logprob,
    selection_logprob,
    transfer_counts,
)
from dllm_ais.samplers import cuda_graphs, diffusion_graphs
from dllm_ais.samplers.diffusion import completion_mask_from_stops
from dllm_ais.types import Rollout


@dataclass(frozen=True)
class SDARSamplerConfig:
    """SDAR sampling (`block_diffusion_generate`'s arguments, generate.py:57-72; TraDo's rollout settings by the same
    names in Gen-Verse/dLLM-RL configs/rl_trado.yaml)."""

    gen_length: int = 32
    """Tokens to generate after each prompt (the canvas is then padded up to whole blocks)."""
    block_length: int = 4
    """Block size Lb (SDAR's released models are trained with 4)."""
    denoising_steps: int = 4
    """Forwards per block S that commit tokens (plus one store pass); n_s splits Lb over them, remainder first."""
    strategy: str = "low_confidence_dynamic"
    """low_confidence_static, low_confidence_dynamic or sequential (models/sdar/selection.py)."""
    threshold: float = 0.9
    """τ of low_confidence_dynamic: slots with confidence > τ commit (TraDo's dynamic_threshold 0.9; generate.py's
    command-line default is 0.85)."""
    temperature: float = 1.0
    """Proposal temperature T; 0 = the official greedy setting (T = 1 with top_k = 1)."""
    top_k: int = 0
    """Top-k filter after / T (0 = off)."""
    top_p: float = 1.0
    """Nucleus filter after top_k (1 = off)."""
    cuda_graphs: str = "auto"
    """CUDA graphs for the block forward (samplers/cuda_graphs.py): auto = on for CUDA rollouts, on, off."""

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"SDAR strategy {self.strategy!r} is unknown: use one of {', '.join(STRATEGIES)}.")
        if self.gen_length < 1 or self.block_length < 1 or self.denoising_steps < 1:
            raise ValueError(f"gen_length={self.gen_length}, block_length={self.block_length} and denoising_steps="
                             f"{self.denoising_steps} must be >= 1.")
        if not 0 < self.threshold < 1:
            raise ValueError(f"SDAR threshold={self.threshold} must be in (0, 1) (low_confidence_dynamic's τ).")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy: T = 1, top_k = 1).")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off).")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off).")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs={self.cuda_graphs!r}: use one of {', '.join(CUDA_GRAPH_MODES)}.")

    @property
    def counts(self) -> list[int]:
        """n_s per denoising step of a block."""
        return transfer_counts(self.block_length, self.denoising_steps)


@dataclass
class _Record:
    """What the sampler writes per canvas column (gathered into the completion at the end)."""

    commit_step: torch.Tensor
    logp: torch.Tensor
    confidence: torch.Tensor
    select: torch.Tensor | None


def _block_forward(model, graphs, x_block, keys, positions, cache, lo) -> torch.Tensor:
    """Logits [B, Lb, V] float32 of the block at canvas [lo, lo + Lb) against the cache (its K/V written into its
    slots); keys [B, T] bool = the keys the block may see. Through the CUDA-graph runner when there is one."""
    start = torch.tensor(lo, device=x_block.device)
    if graphs is not None:
        return graphs.logits(model, x_block, keys, positions, cache, start).to(torch.float32, copy=True)
    return diffusion_graphs.model_step(model, x_block, keys, positions, cache, start).float()


def _prefill(model, ids: torch.Tensor, keep: torch.Tensor, cache: KVCache, length: int, block_length: int) -> None:
    """One forward of canvas [0, length) (every row's full prompt blocks, padding blocks before them) writing its
    K/V into the cache: block-causal, padding keys hidden, each query sees itself."""
    B, T = ids.shape
    dev = ids.device
    blk = torch.arange(length, device=dev) // block_length
    causal = blk[None, :] <= blk[:, None]  # [n, n]
    mask = torch.zeros(B, length, T, dtype=torch.bool, device=dev)
    mask[:, :, :length] = (causal[None] & keep[:, None, :length]) | torch.eye(length, dtype=torch.bool, device=dev)
    model(input_ids=ids[:, :length], attention_mask=mask[:, None], kv_cache=cache, window_start=0,
          position_ids=padded_positions(keep)[:, :length], positions=slice(0, 0))


def _graph_runner(model, config: SDARSamplerConfig, B: int, T: int, device, capture_fn):
    """The CUDA-graph runner of this call, or None for eager forwards (cuda_graphs resolved as the LLaDA sampler
    does: `on` off CUDA is refused in one line). capture_fn: a test hook (cuda_graphs.eager_capture forces graphs
    through the replay logic on CPU)."""
    if capture_fn is None:
        if not cuda_graphs.use_graphs(config.cuda_graphs, device) or not isinstance(model, torch.nn.Module):
            return None
        capture_fn = cuda_graphs.capture
    return diffusion_graphs.runner(model, config.cuda_graphs, B, T, "sdar-block", diffusion_graphs.model_step,
                                   False, capture_fn=capture_fn)


def _stopped(x: torch.Tensor, prompt_end: torch.Tensor, hi: int, stop_ids: torch.Tensor) -> torch.Tensor:
    """[B] bool: a stop id among the row's completion columns [prompt_end, hi) (generate.py:199)."""
    col = torch.arange(hi, device=x.device)[None, :]
    return (torch.isin(x[:, :hi], stop_ids) & (col >= prompt_end[:, None])).any(-1)


@torch.no_grad()
def sdar_sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: SDARSamplerConfig,
                mask_token_id: int, stop_token_ids: Sequence[int], generator: torch.Generator | None = None,
                record_selection: bool = False, capture_fn: Callable | None = None) -> Rollout:
    """Generate after each left-padded prompt with SDAR's semantics (module docstring).

    model: SDARModel-like (forward with kv_cache / window_start / position_ids, models/sdar/model.py), or a quantised
    copy of one. prompt_ids / prompt_mask [B, P] (left padding). generator: explicit RNG for the draws (T > 0).
    record_selection: also record logp_select. capture_fn: test hook for the CUDA-graph runner (None = by
    config.cuda_graphs and the device)."""
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes with P >= 1.")
    rule = SDARRule.of(config, mask_token_id)
    Lb, counts, dev = config.block_length, config.counts, prompt_ids.device
    canvas = block_canvas(prompt_ids, prompt_mask, Lb, config.gen_length, mask_token_id)
    x, keep = canvas.ids.clone(), canvas.keep
    B, T = x.shape
    graphs = _graph_runner(model, config, B, T, dev, capture_fn)
    cache = graphs.kv_cache(model, B, T) if graphs is not None else KVCache.for_model(model, B, T)
    rec = _Record(commit_step=torch.full((B, T), -1, dtype=torch.long, device=dev),
                  logp=torch.zeros(B, T, dtype=torch.float32, device=dev),
                  confidence=torch.full((B, T), torch.nan, dtype=torch.float32, device=dev),
                  select=torch.zeros(B, T, dtype=torch.float64, device=dev) if record_selection else None)
    stop_ids = torch.tensor(list(stop_token_ids), dtype=x.dtype, device=dev)
    Q = canvas.first_block
    nfe = steps = 0
    if Q > 0:
        _prefill(model, x, keep, cache, Q * Lb, Lb)
        nfe += 1
    live = torch.ones(B, dtype=torch.bool, device=dev)  # rows still generating
    positions = torch.arange(Lb, device=dev).expand(B, -1)
    col = torch.arange(T, device=dev)[None, :]
    for k in range(Q, canvas.num_blocks):
        lo, hi = k * Lb, (k + 1) * Lb
        live = live & (canvas.row_end > lo)
        if not bool(live.any()):
            break
        keys = keep & (col < hi)  # [B, T] the blocks <= k of each row
        for s in range(config.denoising_steps + 1):
            masked = (x[:, lo:hi] == mask_token_id) & keep[:, lo:hi] & live[:, None]  # [B, Lb]
            logits = _block_forward(model, graphs, x[:, lo:hi], keys, positions, cache, lo)
            nfe += 1
            if not bool(masked.any()):  # the store pass: the finished block's K/V are now in the cache
                break
            if s == config.denoising_steps:  # unreachable: the quotas of S steps cover a block
                raise RuntimeError("SDAR sampler: masks left after every denoising step of a block.")
            probs = proposal(logits, rule)  # [B, Lb, V] float32
            if config.temperature > 0:  # every slot draws, as the official call does (one multinomial row each)
                tokens = torch.multinomial(probs.view(B * Lb, -1), 1, generator=generator).view(B, Lb)
            else:  # greedy: top_k = 1 leaves the argmax alone
                tokens = probs.argmax(-1)
            conf = probs.gather(-1, tokens[..., None]).squeeze(-1)  # [B, Lb] float32
            quota = torch.full((B,), counts[s], device=dev)
            commit = commit_slots(conf, masked, quota, rule)  # [B, Lb]
            x[:, lo:hi] = torch.where(commit, tokens, x[:, lo:hi])
            rec.commit_step[:, lo:hi][commit] = steps
            rec.confidence[:, lo:hi][commit] = conf[commit]
            if bool(commit.any()):
                rec.logp[:, lo:hi][commit] = proposal_logprob(logits[commit], tokens[commit], rule).float()
            if rec.select is not None:
                term = selection_logprob(logits, masked, commit, tokens, quota, rule)  # [B]
                rec.select[:, lo:hi] = torch.where(commit, term[:, None], rec.select[:, lo:hi])
            steps += 1
        live = live & ~_stopped(x, canvas.prompt_end, hi, stop_ids)
    completion = canvas.gather(x, mask_token_id)
    _, valid = canvas.completion_columns()
    stops = completion_mask_from_stops(completion, stop_token_ids)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask.bool(), completion_ids=completion,
                   completion_mask=stops & valid & (canvas.gather(rec.commit_step, -1) >= 0),
                   commit_step=canvas.gather(rec.commit_step, -1), num_steps=steps,
                   logp_rollout=canvas.gather(rec.logp, 0.0), nfe=nfe,
                   logp_select=None if rec.select is None else canvas.gather(rec.select, 0.0),
                   commit_confidence=canvas.gather(rec.confidence, float("nan")))
