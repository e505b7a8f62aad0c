"""Likelihoods: Monte-Carlo ELBO (diffusion), coupled FP8/BF16 log-ratios, d1's one-step estimator, exact AR log-probs.

Imports only torch. Every estimator takes an explicit torch.Generator (or int seed) and never touches the global RNG.
"""

from dllm_ais.likelihood.autoregressive import (
                                                causal_logprobs,
                                                completion_logprobs,
                                                completion_logprobs_from_hidden,
                                                naive_causal_logprobs,
)
from dllm_ais.likelihood.elbo import ELBOEstimate, elbo, elbo_from_draws
from dllm_ais.likelihood.logprobs import hidden_token_logprobs, token_logprobs
from dllm_ais.likelihood.masks import MASK_SCHEMES, MaskDraws, draw_masks
from dllm_ais.likelihood.one_step import draw_prompt_mask, one_step_logprobs
from dllm_ais.likelihood.ratio import (
                                                LOG_RATIO_ESTIMATORS,
                                                LogRatioEstimate,
                                                antithetic_log_ratio,
                                                coupled_log_ratio,
                                                independent_log_ratio,
)

__all__ = [
    "ELBOEstimate", "LOG_RATIO_ESTIMATORS", "LogRatioEstimate", "MASK_SCHEMES", "MaskDraws", "antithetic_log_ratio",
    "causal_logprobs", "completion_logprobs", "completion_logprobs_from_hidden", "coupled_log_ratio",
    "draw_masks", "draw_prompt_mask", "elbo", "elbo_from_draws", "hidden_token_logprobs", "independent_log_ratio",
    "naive_causal_logprobs", "one_step_logprobs", "token_logprobs",
]
