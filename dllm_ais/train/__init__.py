"""The training loop and what it stands on: the trainer (one GRPO step), the job that builds it from a preset, the
policy-family backends, SFT warm-up, rewards, the run directory and checkpoints, distributed and FSDP helpers."""
