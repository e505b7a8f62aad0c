"""dllm-ais: GRPO for diffusion language models with FP8 rollouts, a BF16 trainer and Adaptive Importance Sampling.

Importing this package is cheap: no Triton, no transformers, no CUDA initialisation. Submodules load what they need.
"""

__version__ = "0.1.0"

from dllm_ais import _moved

_moved.install()  # the pre-0.2 module paths (dllm_ais.grpo, dllm_ais.trainer, ...) still import: see _moved.py
