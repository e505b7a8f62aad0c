"""The quick check's Dream sections (loaded by scripts/gpu_quick.py; a sibling script, not a package): Dream-7B's
shapes (Qwen2 blocks: GQA 28 query / 4 key-value heads, q/k/v biases, vocab 152,064) with random bf16 weights, no
download — each section last in its part, so the LLaDA figures come first and a deadline skips Dream's (recorded).

  dream_forward  (eager part)   one uncached Dream sampler step as models/dream/sampler.py runs it (Dream's own
                                generate has one block: the whole canvas in, the completion's shifted logits out),
                                BF16 master vs the fused FP8 copy (models/dream/fused_fp8.py) on the default backend.
  dream_window   (window part)  the dual-cache window step [batch × block] over a cached canvas (Fast-dLLM's cached
                                Dream generate: `_window_logits`, shifted inside the window), BF16 vs FP8, eager.
"""

from __future__ import annotations

DREAM_SHAPES = {  # Dream-v0-Instruct-7B (config.json) and a tiny stand-in for the CPU dry run (ids as models/tiny.py)
    "full": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=4096, rope_theta=1e6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, rope_theta=10000.0,
                 mask_token_id=4, pad_token_id=1, eos_token_id=1, bos_token_id=2),
}


def random_dream(config, seed: int, device, std: float = 0.02):
    """DreamModel built on meta, materialised on `device` in bf16: Linear/Embedding weights and the q/k/v biases
    ~ N(0, std²) from a generator on the device, RMSNorm weights 1. In eval mode."""
    import torch
    from torch import nn

    from dllm_ais.models.dream.model import DreamModel, DreamRMSNorm

    with torch.device("meta"):
        model = DreamModel(config).to(torch.bfloat16)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0.0, std, generator=generator)
            elif isinstance(module, DreamRMSNorm):
                module.weight.fill_(1.0)
    return model.eval()


class DreamSetup:
    """A random Dream-7B-shaped master (tiny with --tiny) and the quick check's canvas: `q.WORKLOAD`'s batch, prompt,
    completion and block."""

    def __init__(self, q, args) -> None:
        import time

        import torch

        from dllm_ais.models.dream.model import DreamConfig

        self.q, self.device = q, torch.device(args.device)
        self.w = q.WORKLOAD["tiny" if args.tiny else "full"]
        self.config = DreamConfig(**DREAM_SHAPES["tiny" if args.tiny else "full"])
        t0 = time.perf_counter()
        self.master = random_dream(self.config, seed=0, device=self.device)
        self.build_s = time.perf_counter() - t0
        B, P, L = self.w["batch"], self.w["prompt"], self.w["gen"]
        g = torch.Generator(device=self.device).manual_seed(0)
        ids, mask = q._script("bench_rollout").random_prompts(B, P, self.config.vocab_size,
                                                              self.config.mask_token_id, g, self.device)
        masks = torch.full((B, L), self.config.mask_token_id, dtype=ids.dtype, device=self.device)
        self.x = torch.cat([ids, masks], dim=1)  # [B, P + L]
        self.attn = torch.cat([mask, torch.ones(B, L, dtype=torch.bool, device=self.device)], dim=1)
        self.lo, self.hi = P, P + self.w["block"]

    def fp8_copy(self, backend: str):
        from dllm_ais.fp8 import prepare_gemm_shapes, quantize_model

        B, T = self.x.shape
        copy = quantize_model(self.master, backend=backend, expected_m=B * T)  # the fused Dream copy
        prepare_gemm_shapes(copy, [B * T, B * self.w["block"]])
        return copy

    def forward(self, model):
        """One uncached Dream step: the whole canvas in, the completion's shifted logits out [B, L, V]."""
        from dllm_ais.models.dream.sampler import _shifted_rows

        return _shifted_rows(model, self.x, self.attn, self.lo, self.x.shape[1])

    def window(self, model):
        """The dual-cache window step (its cache filled by one refresh now): the block [B, Lb] against the cache."""
        from dllm_ais.models.dream.sampler import _window_logits
        from dllm_ais.models.kv_cache import KVCache

        kv = KVCache.for_model(model, self.x.shape[0], self.x.shape[1])
        Lb = self.hi - self.lo
        _window_logits(model, self.x, self.attn, self.lo, kv, Lb, refresh=True)
        block = self.x[:, self.lo:self.hi]
        return lambda: _window_logits(model, block, self.attn, self.lo, kv, Lb)


def dream_forward_section(q, args, rows, default: str) -> None:
    """forward_ms_dream_bf16_eager / forward_ms_dream_fp8_eager (the eager part's last section)."""
    s = DreamSetup(q, args)
    rows("dream", "dream_master_build_s", s.build_s, shape=DREAM_SHAPES["tiny" if args.tiny else "full"])
    rows("dream", "forward_ms_dream_bf16_eager", q.time_ms(lambda: s.forward(s.master), s.device))
    copy = s.fp8_copy(default)
    rows("dream", "forward_ms_dream_fp8_eager", q.time_ms(lambda: s.forward(copy), s.device),
         fp8_backend=default, rollout_type=type(copy).__name__)
    dev, s, copy = s.device, None, None
    q._free(dev)


def dream_window_section(q, args, rows, default: str) -> None:
    """window_ms_dream_bf16 / window_ms_dream_fp8: the dual-cache window step, eager (the window part's last)."""
    s = DreamSetup(q, args)
    rows("dream", "window_ms_dream_bf16", q.time_ms(s.window(s.master), s.device))
    copy = s.fp8_copy(default)
    rows("dream", "window_ms_dream_fp8", q.time_ms(s.window(copy), s.device), fp8_backend=default)
    dev, s, copy = s.device, None, None
    q._free(dev)
