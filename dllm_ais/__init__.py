"""dllm-ais: GRPO for diffusion language models with FP8 rollouts, a BF16 trainer and Adaptive Importance Sampling.

Importing this package is cheap: no Triton, no transformers, no CUDA initialisation. Submodules load what they need.
"""

__version__ = "0.1.0"
