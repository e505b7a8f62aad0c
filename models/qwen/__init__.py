"""Qwen2 / Qwen3 through transformers: the autoregressive family (samplers/autoregressive.py, exact token
likelihoods). The family's record is family.py."""
