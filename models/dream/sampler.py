"""Masked-diffusion sampling with Dream's `diffusion_generate` semantics, and Fast-dLLM's cached Dream generate.

Read off Dream-org/Dream-v0-Instruct-7B `generation_utils.py` (`_sample`, `sample_tokens`) and NVlabs/Fast-dLLM
`dream/model/generation_utils_block.py`. The law of one step (filtered proposal, confidences, schedule, selection) is
in models/dream/selection.py, shared with the trajectory likelihood. canvas = [left-padded prompt | MASK × L];
the model returns raw logits and masked position i reads the raw row i − 1 (Dream's shift).

`cache="none"` — `diffusion_generate`: `steps` full forwards over one block (the whole completion). Step i:
  origin        every masked position moves with probability 1 − t_{i+1}/t_i (1 at the last step), its token drawn
                from the proposal.
  maskgit_plus, topk_margin, entropy   every masked position draws a token (argmax at T = 0) and gets a confidence;
                the k = int(mean masks per row · (1 − s/t)) most confident commit (all at the last step; one k for
                the batch; the first step commits nothing when steps = L), or with alg_temp > 0 k positions drawn
                without replacement from softmax(confidence / alg_temp).
  threshold τ   Fast-dLLM's uncached `confidence_threshold` (NVlabs/Fast-dLLM dream/model/generation_utils.py):
                a quota of L / steps per step plus what earlier steps left; the most confident masked position and
                every other of the quota's most confident with confidence >= τ commit (maskgit_plus confidences);
                a shortfall at the last step adds a step (selection.py `ThresholdQuota`), so NFE >= steps. Each
                row keeps its own count (Fast-dLLM runs one row); rows that finished wait for the others.
`cache="prefix"|"dual"` — Fast-dLLM's `_sample` with `use_cache`: blocks of block_length left to right, steps /
num_blocks forwards each. A block starts with a full forward (it refreshes every cached K/V) whose draw commits the
block's first position unconditionally; its later forwards feed the block and everything after it (prefix) or the
block only (dual, overwriting its cache slots) and are shifted within the window (the window's first row keeps its
own logits: it is the committed first position). Fixed schedule: the later forwards t = 1 .. S − 1 follow the
schedule above with timesteps of S = steps / num_blocks and the block's masks (Fast-dLLM always reads entropy
confidences there; here `alg` is honoured, so alg="entropy" is Fast-dLLM's). `threshold` τ (Fast-dLLM's
`confidence_threshold`, maskgit_plus confidences): each later forward commits the most confident masked position of
the block and every one with confidence ≥ τ, until the block is full; at least one cached forward follows the refresh
(Fast-dLLM's NFE counts it). Rows move block by block together (the official code runs one row).

Departures from the official code (none changes what a trained model samples): the mask token is never proposed
(the official code can draw it and leaves the position masked); exact ties in confidence go to the lower position
(the official torch.topk breaks them arbitrarily); the proposal is filtered in float32 whatever the model's dtype;
with left padding the cache windows attend over the padded canvas correctly (Fast-dLLM's cached windows mis-slice
the 4-D mask with padding); logits are computed for the completion (or the window) only.

Recorded as LLaDA's sampler records (samplers/diffusion.py, dllm_ais/types.py `Rollout`): commit_step (global
forward index: the canvas of step t is the prompt plus the tokens with commit_step < t; cached steps saw the
cache's approximation), logp_rollout (log q of each token under the filtered proposal of its step), logp_select
(record_selection: the step's selection log-term, repeated on the tokens it committed; 0 for a refresh's forced
commit), commit_confidence (the filtered probability each token was drawn with), nfe = num_steps = forward calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dllm_ais.models.dream.selection import (
    ALGORITHMS,
    DreamRule,
    ThresholdQuota,
    dream_selection_logprob,
    filter_logits,
    move_probability,
    proposal_logprob,
    scheduled_count,
    token_confidence,
)
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.samplers.diffusion import commit_mask, completion_mask_from_stops, threshold_commit
from dllm_ais.types import Rollout

CACHE_MODES = ("none", "prefix", "dual")


@dataclass(frozen=True)
class DreamSamplerConfig:
    """Dream sampling (`diffusion_generate` / Fast-dLLM's cached Dream generate); names as the official kwargs."""

    gen_length: int = 32
    """Completion length L (Dream's max_new_tokens)."""
    steps: int = 32
    """Denoising steps (forwards) in all; with a cache steps / num_blocks per block."""
    alg: str = "entropy"
    """origin, maskgit_plus, topk_margin or entropy (models/dream/selection.py)."""
    alg_temp: float = 0.0
    """0 = commit the k most confident positions; > 0 = draw them from softmax(confidence / alg_temp)."""
    temperature: float = 0.0
    """Proposal temperature T (0 = argmax)."""
    top_p: float | None = None
    """Nucleus filter after / T (None = off); the token crossing p is kept."""
    top_k: int | None = None
    """Top-k filter after top_p (None = off)."""
    eps: float = 1e-3
    """Last timestep of linspace(1, eps, steps + 1)."""
    cache: str = "none"
    """Fast-dLLM's block KV cache: none (Dream's own generate), prefix or dual."""
    block_length: int | None = None
    """Block size with a cache (None = gen_length: one block, which __post_init__ writes back); the uncached generate
    has a single block."""
    threshold: float | None = None
    """Fast-dLLM threshold τ in (0, 1] (alg maskgit_plus, alg_temp 0): with a cache each window step commits the most
    confident position and every one >= τ; without one, Fast-dLLM's uncached `confidence_threshold` (quota L / steps
    per step plus what earlier steps left, gen_length divisible by steps; `ThresholdQuota`). None = the schedule."""

    def __post_init__(self):
        if self.alg not in ALGORITHMS:
            raise ValueError(f"Dream alg={self.alg!r} is unknown: use one of {', '.join(ALGORITHMS)}.")
        if self.alg_temp is None or self.alg_temp < 0:
            raise ValueError(f"Dream alg_temp={self.alg_temp} must be >= 0 (0 = the most confident positions).")
        if self.gen_length < 1 or self.steps < 1:
            raise ValueError(f"gen_length={self.gen_length} and steps={self.steps} must be >= 1.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (or None: off).")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k} must be >= 1 (or None: off).")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps={self.eps} must be in (0, 1) (Dream's default 1e-3).")
        if self.cache not in CACHE_MODES:
            raise ValueError(f"Dream cache={self.cache!r}: use one of {', '.join(CACHE_MODES)}.")
        if self.block_length is None:
            object.__setattr__(self, "block_length", self.gen_length)
        Lb = self.block
        if self.gen_length % Lb:
            raise ValueError(f"gen_length={self.gen_length} is not a multiple of block_length={Lb}; change one.")
        if self.threshold is not None:
            if not 0 < self.threshold <= 1:
                raise ValueError(f"threshold={self.threshold} must be in (0, 1] (or None: fixed schedule).")
            if self.alg != "maskgit_plus" or self.alg_temp > 0:
                raise ValueError(f"threshold decoding reads maskgit_plus confidences (Fast-dLLM's "
                                 f"confidence_threshold), not alg={self.alg!r} with alg_temp {self.alg_temp}: set "
                                 "--dream-alg maskgit_plus (alg_temp 0).")
        if self.cache == "none":
            if Lb != self.gen_length:
                raise ValueError(f"block_length={Lb} needs a cache (--cache prefix or dual): Dream's own generate "
                                 "has one block.")
            if self.threshold is not None and self.gen_length % self.steps:
                raise ValueError(f"threshold decoding without a cache needs gen_length ({self.gen_length}) divisible "
                                 f"by steps ({self.steps}) (Fast-dLLM's assertion); change --steps.")
            return
        if self.steps % self.num_blocks:
            raise ValueError(f"steps={self.steps} must be a multiple of the number of blocks ({self.num_blocks}).")
        if self.alg == "origin":
            raise ValueError("alg='origin' has no cached variant in Fast-dLLM: use --cache none or another alg.")
        if self.threshold is None and self.steps // self.num_blocks < 2:
            raise ValueError(f"steps={self.steps} gives {self.steps // self.num_blocks} step per block: the cached "
                             "schedule needs >= 2 (the refresh commits one position only); raise steps.")

    @property
    def block(self) -> int:
        """The block length in effect."""
        return self.block_length if self.block_length is not None else self.gen_length

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block

    @property
    def cfg_scale(self) -> float:
        """Dream's sampler has no classifier-free guidance (the trajectory replay reads SamplerConfig's name)."""
        return 0.0


def _shifted_rows(model, x: torch.Tensor, attn: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Shifted logits [B, hi − lo, V] float32 of canvas positions lo:hi from a full forward (raw rows lo−1:hi−1;
    position 0 reuses its own row)."""
    if lo >= 1:
        rows = slice(lo - 1, hi - 1)
    else:
        rows = (torch.arange(lo, hi, device=x.device) - 1).clamp_min(0).expand(x.shape[0], -1)
    return model(input_ids=x, attention_mask=attn, positions=rows).logits.float()


def _window_logits(model, window: torch.Tensor, attn: torch.Tensor, lo: int, kv_cache: KVCache, Lb: int,
                   refresh: bool = False) -> torch.Tensor:
    """Block logits [B, Lb, V] float32 of a cached forward: shifted within the window (Fast-dLLM's cat of row 0 with
    rows :-1), so the block's first row keeps its own logits (that position is committed at the refresh). refresh:
    the full forward, [B, 1, V] for the block's first position."""
    if refresh:  # the whole canvas, every K/V rewritten: the block's first position reads raw row lo − 1
        return model(input_ids=window, attention_mask=attn, positions=slice(lo - 1, lo),
                     kv_cache=kv_cache, window_start=0).logits.float()
    raw = model(input_ids=window, attention_mask=attn, positions=slice(0, Lb), kv_cache=kv_cache,
                window_start=lo).logits.float()
    return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)


@dataclass
class _Record:
    """What the sampler writes per completion position."""

    commit_step: torch.Tensor
    logp: torch.Tensor
    confidence: torch.Tensor
    select: torch.Tensor | None


class _Sampler:
    """One rollout's state: the canvas, the record, the RNG and the rule."""

    def __init__(self, model, prompt_ids, prompt_mask, config: DreamSamplerConfig, mask_token_id: int, generator,
                 record_selection: bool):
        self.model, self.config, self.mask, self.generator = model, config, mask_token_id, generator
        B, P = prompt_ids.shape
        L, dev = config.gen_length, prompt_ids.device
        self.P, self.B = P, B
        self.x = torch.cat([prompt_ids, torch.full((B, L), mask_token_id, dtype=prompt_ids.dtype, device=dev)], 1)
        self.attn = torch.cat([prompt_mask, torch.ones(B, L, dtype=torch.bool, device=dev)], dim=1)  # [B, P + L]
        self.rule = DreamRule.of(config, mask_token_id)
        self.rec = _Record(commit_step=torch.full((B, L), -1, dtype=torch.long, device=dev),
                           logp=torch.zeros(B, L, dtype=torch.float32, device=dev),
                           confidence=torch.full((B, L), torch.nan, dtype=torch.float32, device=dev),
                           select=torch.zeros(B, L, dtype=torch.float64, device=dev) if record_selection else None)
        self.step = 0

    def draw(self, logits: torch.Tensor, need: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [B, n] drawn from the filtered proposal where `need` [B, n] (argmax at T = 0; anything elsewhere)
        and the filtered probabilities [B, n, V] float32."""
        probs = torch.softmax(filter_logits(logits, self.rule), dim=-1)  # [B, n, V]
        if self.config.temperature == 0:
            return probs.max(dim=-1).indices, probs
        tokens = probs.max(dim=-1).indices
        if bool(need.any()):
            tokens[need] = torch.multinomial(probs[need], 1, generator=self.generator).squeeze(-1)
        return tokens, probs

    def commit(self, lo: int, logits: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor,
               tokens: torch.Tensor, probs: torch.Tensor, p_move: float | None = None, forced: bool = False,
               expected: torch.Tensor | None = None) -> None:
        """Write the committed tokens of canvas positions lo:lo+n and their record; advance the step counter."""
        n = commit.shape[1]
        c0 = lo - self.P
        self.x[:, lo:lo + n] = torch.where(commit, tokens.to(self.x.dtype), self.x[:, lo:lo + n])
        self.rec.commit_step[:, c0:c0 + n][commit] = self.step
        q = probs.gather(-1, tokens[..., None]).squeeze(-1)  # [B, n]
        self.rec.confidence[:, c0:c0 + n][commit] = q[commit]
        if bool(commit.any()):
            self.rec.logp[:, c0:c0 + n][commit] = proposal_logprob(logits[commit], tokens[commit],
                                                                   self.rule).float()
        if self.rec.select is not None and not forced:
            term = dream_selection_logprob(logits, masked, commit, tokens, self.rule, p_move, expected)  # [B]
            sel = self.rec.select[:, c0:c0 + n]
            self.rec.select[:, c0:c0 + n] = torch.where(commit, term[:, None], sel)
        self.step += 1

    def scheduled_step(self, lo: int, logits: torch.Tensor, i: int, steps: int) -> None:
        """One step of Dream's schedule over canvas positions lo:lo+n (logits [B, n, V] shifted)."""
        cfg = self.config
        n = logits.shape[1]
        masked = self.x[:, lo:lo + n] == self.mask  # [B, n]
        if cfg.alg == "origin":
            p_move = move_probability(i, steps, cfg.eps)
            u = torch.rand(masked.shape, generator=self.generator, device=masked.device)
            commit = masked & (u < torch.tensor(p_move, dtype=torch.float32) if p_move < 1 else masked)
            tokens, probs = self.draw(logits, commit)
            return self.commit(lo, logits, masked, commit, tokens, probs, p_move)
        tokens, probs = self.draw(logits, masked)
        conf = torch.where(masked, token_confidence(probs, tokens, cfg.alg), -torch.inf)  # [B, n]
        k = scheduled_count(masked, i, steps, cfg.eps)
        commit = torch.zeros_like(masked)
        if k > 0 and cfg.alg_temp > 0:
            weights = torch.softmax(conf / cfg.alg_temp, dim=-1)
            picked = torch.multinomial(weights, k, replacement=False, generator=self.generator)  # [B, k]
            commit.scatter_(1, picked, True)
        elif k > 0:
            commit = commit_mask(conf, torch.full((self.B,), k, device=conf.device)) & masked
        self.commit(lo, logits, masked, commit, tokens, probs)

    def threshold_step(self, lo: int, logits: torch.Tensor, quota: torch.Tensor | None = None) -> torch.Tensor:
        """Fast-dLLM's threshold commit over canvas positions lo:lo+n (maskgit_plus confidences; equality commits);
        quota [B]: the uncached threshold's (at most the quota most confident). -> the tokens committed per row [B]."""
        n = logits.shape[1]
        masked = self.x[:, lo:lo + n] == self.mask
        tokens, probs = self.draw(logits, masked)
        conf = torch.where(masked, token_confidence(probs, tokens, "maskgit_plus"), -torch.inf)
        commit = threshold_commit(conf, masked, self.config.threshold, quota)
        self.commit(lo, logits, masked, commit, tokens, probs, expected=quota)
        return commit.sum(-1)

    def refresh_commit(self, lo: int, logits: torch.Tensor) -> None:
        """A block's refresh: its first position takes the proposal's draw unconditionally (Fast-dLLM)."""
        first = torch.zeros(self.B, logits.shape[1], dtype=torch.bool, device=logits.device)
        first[:, 0] = self.x[:, lo] == self.mask
        tokens, probs = self.draw(logits, first)
        self.commit(lo, logits, first, first, tokens, probs, forced=True)


def _check_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: DreamSamplerConfig,
                  kv_cache: KVCache | None) -> None:
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes with P >= 1.")
    if kv_cache is not None:
        B, T = prompt_ids.shape[0], prompt_ids.shape[1] + config.gen_length
        if config.cache == "none":
            raise ValueError("a kv_cache was passed with cache='none': pass --cache prefix or dual, or no cache.")
        held = kv_cache.k[0].shape[0]  # one [B, H_kv, T, D] tensor per layer
        if held != B or kv_cache.length != T:
            raise ValueError(f"--cache {config.cache}: the KV cache holds batch {held} × length {kv_cache.length}, "
                             f"this call needs {B} × {T}: allocate KVCache.for_model(model, {B}, {T}) or sample "
                             f"{held} rows per call.")


@torch.no_grad()
def dream_sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: DreamSamplerConfig,
                 mask_token_id: int, stop_token_ids: Sequence[int], generator: torch.Generator | None = None,
                 record_selection: bool = False, kv_cache: KVCache | None = None) -> Rollout:
    """Generate `config.gen_length` tokens after each left-padded prompt with Dream's semantics (module docstring).

    model: callable as model(input_ids, attention_mask, positions[, kv_cache, window_start]) -> .logits RAW
    (unshifted, models/dream/model.py's DreamModel). prompt_ids / prompt_mask [B, P] (left padding). generator: explicit
    RNG for the draws. record_selection: also record logp_select. kv_cache: a preallocated cache for the cached modes
    (default: KVCache.for_model(model, B, P + L)); refused unless it holds exactly this batch and canvas.
    """
    _check_inputs(prompt_ids, prompt_mask, config, kv_cache)
    prompt_mask = prompt_mask.bool()
    s = _Sampler(model, prompt_ids, prompt_mask, config, mask_token_id, generator, record_selection)
    P, L, Lb = s.P, config.gen_length, config.block
    if config.cache == "none" and config.threshold is not None:  # Fast-dLLM's uncached confidence_threshold
        quota = ThresholdQuota(s.B, L, config.steps, prompt_ids.device)
        while not bool(quota.done.all()):
            quota.update(s.threshold_step(P, _shifted_rows(model, s.x, s.attn, P, P + L), quota.quota()))
    elif config.cache == "none":
        for i in range(config.steps):
            s.scheduled_step(P, _shifted_rows(model, s.x, s.attn, P, P + L), i, config.steps)
    else:
        if kv_cache is None:
            kv_cache = KVCache.for_model(model, s.B, P + L)
        S = config.steps // config.num_blocks
        for b in range(config.num_blocks):
            lo, hi = P + b * Lb, P + (b + 1) * Lb
            s.refresh_commit(lo, _window_logits(model, s.x, s.attn, lo, kv_cache, Lb, refresh=True))
            i = 1
            while True:
                window = s.x[:, lo:] if config.cache == "prefix" else s.x[:, lo:hi]
                logits = _window_logits(model, window, s.attn, lo, kv_cache, Lb)
                if config.threshold is not None:
                    s.threshold_step(lo, logits)
                else:
                    s.scheduled_step(lo, logits, i, S)
                    i += 1
                if not bool((s.x[:, lo:hi] == mask_token_id).any()) or (config.threshold is None and i == S):
                    break
    completion = s.x[:, P:]
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion,
                   completion_mask=completion_mask_from_stops(completion, stop_token_ids),
                   commit_step=s.rec.commit_step, num_steps=s.step, logp_rollout=s.rec.logp, nfe=s.step,
                   logp_select=s.rec.select, commit_confidence=s.rec.confidence)
