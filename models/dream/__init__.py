"""Dream (Dream-org/Dream-v0-Instruct-7B): Qwen2 weights with bidirectional attention and shifted logits, its own
sampler (diffusion_generate's algorithms, Fast-dLLM's cache) and path law. The family's record is family.py."""
