"""SDAR (JetAstra/SDAR) and TraDo (Gen-Verse/dLLM-RL): Qwen3 weights as a block-diffusion model — block-causal
attention with a native per-block KV cache, its own sampler (`block_diffusion_generate`'s strategies) and path law.
The family's record is family.py."""
