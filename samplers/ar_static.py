"""Autoregressive sampling on the compact rollout model (models/qwen/rollout.py): static KV cache, chunked prefill, and
a decode step that touches only preallocated device tensors, so on CUDA it is captured once as a CUDA graph and
replayed per token (gpt-fast's structure, with explicit `torch.cuda.CUDAGraph` capture instead of torch.compile;
the capture is samplers/cuda_graphs.py's, shared with the diffusion sampler).

The distribution sampled from and the value recorded are exactly those of `samplers/autoregressive.py`
(`sampling_logprobs`, Gumbel-max on the same uniform draws: `torch.rand([B, V], float64)` from the caller's generator,
one draw per sampled column, in the same order), so for the same logits and generator both samplers return the same
tokens and log-probs. The one difference in stream use: the noise for a step is drawn outside the graph into a static
buffer (a generator cannot be advanced inside a replayed graph), and after every row has finished up to
`check_every − 1` extra steps may run (and draw) before the host notices — their columns are padding either way.

One step (all on the device, no host read):
  prev    = completion[:, t − 1]                  the token fed back (padding for finished rows)
  logits  = model.decode_logits(prev, pos, slot)  writes K/V at `slot`; attends to real tokens in slots ≤ slot
  column t: token, log π(token) (0 for finished rows), mask = not finished
  finished |= token ∈ stop ids;  t, pos, slot += 1
Finished rows keep their slots and keep decoding padding; the host checks "all finished" every `check_every` steps.
The cache capacity is P + L rounded up to a multiple of 256 (nearby prompt lengths reuse one decoder and its graph);
in float32/float64 the extra masked slots change nothing measurable, in bf16 SDPA's arithmetic over a longer key axis
differs from a teacher-forced pass by a few bf16 ulps of the logits (the recorded value is the one sampled from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dllm_ais.progress import progress_bar
from dllm_ais.types import Rollout

from . import cuda_graphs
from .ar_common import ARSamplerConfig, check_prompts, gumbel_argmax, sampling_logprobs


@dataclass(frozen=True)
class StaticDecodeConfig:
    """Engine settings of the static-cache sampler (they change speed, never the tokens or log-probs)."""

    prefill_chunk: int = 512
    """Prompt columns per prefill forward (bounds the prefill's activation memory)."""
    check_every: int = 8
    """Steps between host checks of "every row finished" (each check is one device→host sync)."""
    cuda_graph: bool = True
    """Capture the decode step as a CUDA graph on CUDA devices (ignored elsewhere: CPU runs eagerly)."""

    def __post_init__(self):
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={self.prefill_chunk} must be >= 1.")
        if self.check_every < 1:
            raise ValueError(f"check_every={self.check_every} must be >= 1 (1 = check after every step).")


class StaticDecoder:
    """The static buffers of one (batch B, cache length S, completion length L, sampling config) and the decode step
    over them. `reset` loads a new batch of prompts in place, so a captured graph stays valid across calls."""

    def __init__(self, model, batch: int, cache_len: int, config: ARSamplerConfig, stop_ids: torch.Tensor,
                 pad: int) -> None:
        dev, L, V = model.device, config.max_new_tokens, model.shape.vocab_size
        self.model, self.config, self.pad, self.stop_ids = model, config, pad, stop_ids
        self.greedy = config.temperature == 0
        self.completion = torch.full((batch, L), pad, dtype=torch.long, device=dev)  # [B, L]
        self.mask = torch.zeros(batch, L, dtype=torch.bool, device=dev)  # [B, L]
        self.logp = torch.zeros(batch, L, dtype=torch.float32, device=dev)  # [B, L]
        self.done = torch.zeros(batch, dtype=torch.bool, device=dev)  # [B]
        self.t = torch.zeros(1, dtype=torch.long, device=dev)  # next column to fill
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)  # cache slot of the token fed next
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)  # its RoPE position per row
        self.key_valid = torch.zeros(batch, cache_len, dtype=torch.bool, device=dev)  # [B, S]
        self.noise = torch.zeros(batch, V, dtype=torch.float64, device=dev)  # [B, V] uniforms of the next draw
        self.graph = None

    def reset(self, prompt_mask: torch.Tensor) -> None:
        """Start a batch: prompt_mask [B, P] (left-padded) -> empty completion, slot P, positions = real counts."""
        P, L = prompt_mask.shape[1], self.completion.shape[1]
        self.completion.fill_(self.pad)
        self.mask.zero_()
        self.logp.zero_()
        self.done.zero_()
        self.t.zero_()
        self.slot.fill_(P)
        self.pos.copy_(prompt_mask.sum(-1))
        self.key_valid.zero_()
        self.key_valid[:, :P] = prompt_mask
        self.key_valid[:, P:P + L] = True

    def draw(self, generator: torch.Generator | None) -> None:
        """Uniforms for the next sampled column (nothing at T = 0); the same call and shape as sample_tokens."""
        if not self.greedy:
            torch.rand(self.noise.shape, generator=generator, dtype=torch.float64, out=self.noise)

    def sample_column(self, logits: torch.Tensor) -> None:
        """logits [B, V] -> column t of completion/mask/logp; finished rows get padding, mask False and logp 0."""
        logp = sampling_logprobs(logits, self.config)  # [B, V] float64
        token = logp.argmax(-1) if self.greedy else gumbel_argmax(logp, self.noise)  # [B]
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)  # [B]
        token = torch.where(self.done, self.pad, token)
        self.completion.index_copy_(1, self.t, token[:, None])
        self.logp.index_copy_(1, self.t, torch.where(self.done, 0.0, token_logp).float()[:, None])
        self.mask.index_copy_(1, self.t, ~self.done[:, None])
        self.done |= (token[:, None] == self.stop_ids).any(-1)
        self.t += 1

    def step(self) -> None:
        """Feed column t − 1 back and sample column t (device tensors only)."""
        prev = self.completion.index_select(1, self.t - 1).squeeze(1)  # [B]
        logits = self.model.decode_logits(prev, self.pos, self.slot, self.key_valid)  # [B, V]
        self.pos += 1
        self.slot += 1
        self.sample_column(logits)

    def capture(self) -> None:
        """Record `step` as a CUDA graph (samplers/cuda_graphs.capture: two warm-up steps on a side stream for JIT /
        cuBLAS set-up, each from column 1 and slot 0). The warm-up and capture scribble on the buffers; `reset`
        overwrites everything that is read before it is written."""

        def rewind() -> None:
            self.t.fill_(1)
            self.slot.zero_()

        self.graph, _ = cuda_graphs.capture(self.step, self.t.device, warmup=2, prepare=rewind)

    def run_step(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.replay()


def _decoder(model, B: int, P: int, config: ARSamplerConfig, stops: tuple[int, ...], pad: int,
             engine: StaticDecodeConfig) -> StaticDecoder:
    """A decoder for this call: reused (with its graph) when batch, cache capacity and settings match."""
    L = config.max_new_tokens
    need = P + L
    cap = model.cache_len if model.k_cache and model.k_cache[0].shape[0] == B and model.cache_len >= need else 0
    cap = cap or -(-need // 256) * 256  # round the capacity up, so nearby prompt lengths share one graph
    key = (B, cap, config, stops, pad, engine.cuda_graph)
    cached = getattr(model, "_static_decoder", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    model._static_decoder = None  # free the old graph's pool before building a new one
    model.setup_cache(B, cap)
    dec = StaticDecoder(model, B, cap, config, torch.tensor(stops, device=model.device), pad)
    if engine.cuda_graph and model.device.type == "cuda" and config.max_new_tokens > 1:  # L = 1: no decode step
        dec.capture()
    model._static_decoder = (key, dec)
    return dec


@torch.no_grad()
def static_ar_sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: ARSamplerConfig,
    stop_token_ids: Sequence[int],
    generator: torch.Generator | None = None,
    progress: bool = False,
    pad_token_id: int | None = None,
    engine: StaticDecodeConfig | None = None,
) -> Rollout:
    """`ar_sample`'s contract (same arguments and Rollout) on a `QwenRollout`; see the module docstring."""
    engine = engine or StaticDecodeConfig()
    check_prompts(prompt_ids, prompt_mask)
    stops = tuple(int(s) for s in stop_token_ids)
    if not stops:
        raise ValueError("stop_token_ids is empty: pass at least the EOS id.")
    pad = stops[0] if pad_token_id is None else int(pad_token_id)
    B, P = prompt_ids.shape
    L = config.max_new_tokens
    prompt_mask = prompt_mask.bool()
    dec = _decoder(model, B, P, config, stops, pad, engine)
    dec.reset(prompt_mask)

    pos = (prompt_mask.long().cumsum(-1) - 1).clamp_min(0)  # [B, P]: real tokens count 0, 1, ...; padding gets 0
    logits = model.prefill(prompt_ids, pos, dec.key_valid, engine.prefill_chunk)  # [B, V]
    dec.draw(generator)
    dec.sample_column(logits)
    bar = progress_bar(total=L, enabled=progress, desc="decoding", unit="tok", leave=False)
    bar.update(1)
    for t in range(1, L):
        if t % engine.check_every == 0 and bool(dec.done.all()):
            break
        dec.draw(generator)
        dec.run_step()
        bar.update(1)
    bar.close()
    mask = dec.mask.clone()
    num_steps = int(mask.any(0).sum())  # forwards a per-step check would have made (columns with a live row)
    commit_step = torch.arange(L, device=prompt_ids.device).expand(B, L).clone()
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=dec.completion.clone(),
                   completion_mask=mask, commit_step=commit_step, num_steps=num_steps, logp_rollout=dec.logp.clone())
