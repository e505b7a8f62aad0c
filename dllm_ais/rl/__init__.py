"""The RL math, pure functions over tensors: group advantages, the GRPO/TBPO loss, the importance-sampling corrections
(token, sequence, geometric, TIS, AIS and its λ), mismatch statistics and error tokens, and their frozen configs."""
