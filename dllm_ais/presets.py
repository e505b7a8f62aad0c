"""The named presets (`--preset`): each a whole Preset (dllm_ais/config.py), from the tiny CPU recipes to the 7-8 B
GPU ones with their papers' settings; `get_preset(name)` looks one up."""

from __future__ import annotations

from dataclasses import replace

from dllm_ais.config import ModelConfig, PolicyLikelihoodConfig, Preset, SamplerConfig, TrainConfig
from dllm_ais.rl.config import CorrectionConfig, GRPOConfig


def _d1(name: str, task: str, description: str) -> Preset:
    """d1 / diffu-GRPO settings for LLaDA-8B-Instruct (LoRA r=128, α=64; G=6; 256 tokens, block 32, 128 steps)."""
    return Preset(
        name, description,
        ModelConfig(path="GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda"),
        SamplerConfig(gen_length=256, block_length=32, steps=128, temperature=0.9),
        TrainConfig(task=task, steps=2000 if task in ("countdown", "sudoku") else 4000, prompts_per_step=1,
                    learning_rate=3e-6, weight_decay=0.1, max_grad_norm=0.2, gradient_accumulation_steps=2,
                    fp8_backend="auto", lora_r=128, lora_alpha=64.0, save_every=100),
        GRPOConfig(num_generations=6, scale_rewards="none", epsilon=0.5, beta=0.04, loss_type="grpo",
                   max_completion_length=256, num_iterations=12),
    )


def _dream(name: str, task: str, description: str) -> Preset:
    """Dream-v0-Instruct-7B with d1's RL settings and canvas (256 tokens, 128 steps; one block) so its plan compares
    with llada-8b-gsm8k's like for like; `dllm-ais plan` counts it (about 7.6 B parameters, GQA KV cache)."""
    d1 = _d1(name, task, description)  # one block of 256 (Dream's own generate has no blocks), 128 steps
    # the rule named (the hub's generation_config.json says "origin": random order): entropy, Dream's README's and
    # DARE's (yjyddq/DARE@83ae8a3 verl/workers/rollout/rollout_utils.py:689 and :801, alg="entropy", alg_temp=0.0)
    return replace(d1, model=ModelConfig(family="dream", path="Dream-org/Dream-v0-Instruct-7B", dtype="bfloat16",
                                         device="cuda"),
                   sampler=replace(d1.sampler, block_length=256, dream_alg="entropy", dream_alg_temp=0.0))


def _qwen(name: str, task: str, description: str) -> Preset:
    """Qwen3-8B with FP8 rollouts: exact token-level mismatch weights, LoRA r=64, G=8, 512 new tokens."""
    return Preset(
        name, description,
        ModelConfig(family="qwen", path="Qwen/Qwen3-8B", dtype="bfloat16", device="cuda"),
        SamplerConfig(gen_length=512, block_length=512, steps=1, temperature=1.0),
        TrainConfig(task=task, steps=1000, prompts_per_step=2, learning_rate=1e-6, gradient_accumulation_steps=4,
                    fp8_backend="triton", lora_r=64, lora_alpha=128.0, save_every=100),
        GRPOConfig(num_generations=8, epsilon=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo",
                   max_completion_length=512, num_iterations=1),
        CorrectionConfig(correction_level="token", ais_tau=0.05),
    )


def _trado(name: str, path: str, task: str, description: str) -> Preset:
    """TraDo's RL settings (Gen-Verse/dLLM-RL@10b4fd1 configs/rl_trado.yaml; configs/rl_sdar.yaml has the same
    values): rollouts :33-46 (64 prompts × 16 responses a step, T = 1, top_p 1, top_k 0, 2000 tokens in blocks of 4
    with 4 denoising steps each, low_confidence_dynamic at τ 0.9), training :51-70 (grad accumulation 32 of batch 1,
    max grad norm 1.0, ε 0.2, β 0.01 with the k3 estimator, TraceRL with shrink 1, one epoch over the rollouts),
    optimizer :73-81 (AdamW lr 1e-6, weight decay 0), total_step 80 (:11), full fine-tuning (DeepSpeed ZeRO-3 on 8
    GPUs, :15). TraceRL at shrink 1 scores each token at the canvas of the step that committed it: here the path
    law's token terms (--policy-logprob trajectory without --trajectory-selection, models/sdar/trajectory.py); its
    loss sums the token surrogates over a fixed length L1 per sequence (train/train_trado_policy.py:498-504):
    dr_grpo. The mismatch ratio is the path law of the path that ran. Advantages: ours (group-normalised)."""
    return Preset(
        name, description, ModelConfig(family="sdar", path=path, dtype="bfloat16", device="cuda"),
        SamplerConfig(gen_length=2000, block_length=4, steps=2000, temperature=1.0,
                      sdar_strategy="low_confidence_dynamic", sdar_threshold=0.9),
        TrainConfig(task=task, steps=80, prompts_per_step=64, learning_rate=1e-6, weight_decay=0.0,
                    max_grad_norm=1.0, gradient_accumulation_steps=32, fp8_backend="auto", save_every=10,
                    policy_logprob="trajectory", mismatch_estimator="trajectory"),
        GRPOConfig(num_generations=16, scale_rewards="group", epsilon=0.2, beta=0.01, loss_type="dr_grpo",
                   max_completion_length=2000, num_iterations=1),
    )


def _digits_study(name: str, description: str, length: int, sft_steps: int) -> Preset:
    """A corrections-study testbed: the tiny LLaDA on the `length`-digit shift (length + 1 counted tokens, the stop
    included) decoded one token per step, 80 GRPO steps × 8 prompts × G = 8, lr 5e-4, β = 0 (the policy may
    concentrate), after `sft_steps` of SFT warm-up."""
    n = length + 1
    return Preset(
        name, description, ModelConfig(), SamplerConfig(gen_length=n, block_length=n, steps=n, temperature=1.0),
        TrainConfig(task="digits", task_config={"op": "shift", "length": length}, steps=80, prompts_per_step=8,
                    learning_rate=5e-4, sft_steps=sft_steps, mismatch_num_draws=2),
        GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.0, loss_type="dapo",
                   max_completion_length=n, num_iterations=2))


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # tiny-cpu: chosen from the trials in docs/cpu.md ("How the recipe was chosen"): the digits task with op shift
        # (each digit +1; reverse plateaued near 0.3-0.45 with a repeated-digit policy), lr 2e-4 (5e-4 learned in
        # ~40 steps, too fast to show in quarter means), a k3 KL to the SFT model (beta 0.04, as d1), K = 2 mask
        # draws (mismatch estimation was the costliest phase at K = 4). Prompts go through the tiny tokenizer's chat
        # template. SFT 35 steps teaches the stop token (greedy: 20 steps wrote nothing or too few digits and RL
        # then learned a fifth digit where EOS belongs; 35: the right length on every held-out prompt, strict
        # accuracy well above 0, and RL still has most of the reward to gain); 120 steps (the reward climbs within
        # ~60 steps at this SFT).
        Preset("tiny-cpu", "Tiny built-in LLaDA on CPU: SFT warm-up on digits, then AIS-GRPO with FP8 rollouts.",
               ModelConfig(), SamplerConfig(gen_length=5, block_length=5, steps=5, temperature=1.0),
               TrainConfig(task="digits", task_config={"op": "shift", "length": 4}, steps=120,
                           prompts_per_step=16, learning_rate=2e-4, sft_steps=35, mismatch_num_draws=2),
               GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.04, loss_type="dapo",
                          max_completion_length=5, num_iterations=2)),
        # tiny-dream: tiny-cpu's recipe on the tiny built-in Dream (models/tiny.py; shifted logits, Dream's sampler
        # and schedule, its fused FP8 rollout copy) at lr 5e-4 (2e-4: +0.23 in 120 steps; SFT 100: starts at 0.80,
        # little left to learn); one seed, docs/cpu.md ("The tiny-dream preset").
        Preset("tiny-dream", "Tiny built-in Dream on CPU: SFT warm-up on digits, then AIS-GRPO with FP8 rollouts.",
               ModelConfig(family="dream"), SamplerConfig(gen_length=5, block_length=5, steps=5, temperature=1.0,
                                                          dream_alg="maskgit_plus", dream_alg_temp=0.0),
               TrainConfig(task="digits", task_config={"op": "shift", "length": 4}, steps=120,
                           prompts_per_step=16, learning_rate=5e-4, sft_steps=35, mismatch_num_draws=2),
               GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.04, loss_type="dapo",
                          max_completion_length=5, num_iterations=2)),
        # tiny-sdar: the tiny built-in SDAR (models/sdar/tiny.py; blocks of 4, 2 steps each), the block-wise ELBO
        # with one draw as its policy likelihood (models/sdar/likelihood.py), SFT 60 (35: the SFT model writes EOS
        # first and RL barely moves; 100: greedy already right), lr 5e-4; tiny-cpu's recipe otherwise. Seeds 0 / 1:
        # +0.50 / +0.40, 0.70x tiny-cpu's wall time (one run each), docs/cpu.md ("The tiny-sdar preset").
        Preset("tiny-sdar", "Tiny built-in SDAR on CPU (block diffusion, blocks of 4): SFT warm-up on digits, then "
               "AIS-GRPO with FP8 rollouts and the block-wise ELBO.",
               ModelConfig(family="sdar"), SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0,
                                                         sdar_strategy="low_confidence_dynamic", sdar_threshold=0.9),
               TrainConfig(task="digits", task_config={"op": "shift", "length": 4}, steps=120,
                           prompts_per_step=16, learning_rate=5e-4, sft_steps=60, mismatch_num_draws=2,
                           policy_logprob="elbo", likelihood=PolicyLikelihoodConfig(elbo_draws=1)),
               GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.04, loss_type="dapo",
                          max_completion_length=8, num_iterations=2)),
        # tiny-cpu-justgrpo: tiny-cpu decoded left to right (block length 1: one position per block, each step
        # commits it), so the trajectory likelihood is the exact autoregressive factorisation JustGRPO trains on
        # (tests/test_trajectory_merge.py checks it equals the product of the conditionals); the mismatch ratio is
        # the trajectory one, exact for that path too. Not tuned: tiny-cpu's recipe otherwise.
        Preset("tiny-cpu-justgrpo", "tiny-cpu decoded left to right (block length 1): JustGRPO's exact AR "
               "likelihood as the trajectory policy likelihood.",
               ModelConfig(), SamplerConfig(gen_length=5, block_length=1, steps=5, temperature=1.0),
               TrainConfig(task="digits", task_config={"op": "shift", "length": 4}, steps=120,
                           prompts_per_step=16, learning_rate=2e-4, sft_steps=35, mismatch_num_draws=2,
                           mismatch_estimator="trajectory", policy_logprob="trajectory"),
               GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.04, loss_type="dapo",
                          max_completion_length=5, num_iterations=2)),
        # study-cpu: the testbed of the study's earlier plans (corrections-v1/v2, never run; now study-cpu-16):
        # 12-digit shift (13 counted tokens: Var ℓ ≈ 2·L·κ about 3× the default's), β = 0 and lr 5e-4 so the BF16
        # policy concentrates within the run; SFT 25 steps (strict accuracy 0.0: neither the digits nor the stop are
        # taught yet). Its one-seed pilots are in benchmarks/study/pilots.md (with SFT 40 BF16 and MXFP4 ended level
        # at 0.977 / 0.978; with SFT 25 the harm seen on seed 0 did not survive a second seed).
        _digits_study("study-cpu", "Earlier study testbed (plans v1/v2, never run): 12-digit shift, SFT 25.", 12, 25),
        # study-cpu-16: the testbed of the registered corrections study (study/plan.toml, corrections-v3): study-cpu
        # with 16-digit strings (completions of 17 counted tokens) and SFT 40 steps. Results:
        # benchmarks/study/corrections-v3/.
        _digits_study("study-cpu-16", "Testbed of the corrections study (corrections-v3): 16-digit shift, SFT 40.",
                      16, 40),
        # study-cpu-32: a PILOT CANDIDATE (not registered in any plan): 32-digit strings, completions of 33 counted
        # tokens (Var ℓ ≈ 2·L·κ about twice study-cpu-16's, whose stress arms ended at ESS 0.96-0.99), SFT 60 steps.
        _digits_study("study-cpu-32", "Pilot candidate for the corrections study: study-cpu with 32-digit strings.",
                      32, 60),
        # tiny-cpu-arith: the earlier tiny-cpu (single-digit arith); benchmarks/study/ was produced on it (the study
        # pins this preset and overrides β = 0 and its run size, see dllm_ais/analysis/study.py).
        Preset("tiny-cpu-arith", "The earlier tiny-cpu on single-digit arith: the testbed of benchmarks/study/.",
               ModelConfig(), SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0),
               TrainConfig(task="arith", task_config={"max_operand": 9}, steps=300, prompts_per_step=16,
                           learning_rate=5e-4, sft_steps=200, mismatch_num_draws=2),
               GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.04, loss_type="dapo",
                          max_completion_length=4, num_iterations=2)),
        Preset("llada-8b-instruct", "LLaDA-8B-Instruct from a local directory (--model DIR), bf16 on GPU.",
               ModelConfig(path="GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda"),
               SamplerConfig(gen_length=256, block_length=32, steps=128)),
        _d1("llada-8b-gsm8k", "gsm8k", "LLaDA-8B-Instruct AIS-GRPO on GSM8K, d1's settings (8 GPUs, accelerate)."),
        _d1("llada-8b-math", "math500", "LLaDA-8B-Instruct AIS-GRPO on MATH, d1's settings (--data MATH train file)."),
        _d1("llada-8b-countdown", "countdown", "LLaDA-8B-Instruct AIS-GRPO on Countdown (procedural), d1's settings."),
        _d1("llada-8b-sudoku", "sudoku", "LLaDA-8B-Instruct AIS-GRPO on 4x4 Sudoku (procedural), d1's settings."),
        # SDAR / TraDo (block diffusion, models/sdar/): TraDo's own RL settings (`_trado`, cited there)
        _trado("sdar-8b-gsm8k", "JetAstra/SDAR-8B-Chat", "gsm8k",
               "SDAR-8B-Chat AIS-GRPO on GSM8K with TraDo's RL settings (configs/rl_sdar.yaml; 8 GPUs)."),
        _trado("trado-8b-math", "Gen-Verse/TraDo-8B-Instruct", "math500",
               "TraDo-8B-Instruct AIS-GRPO on MATH with TraDo's RL settings (--data: MATH train file; 8 GPUs)."),
        _dream("dream-7b-gsm8k", "gsm8k", "Dream-v0-Instruct-7B AIS-GRPO on GSM8K, d1's settings (one block of 256)."),
        _dream("dream-7b-math", "math500", "Dream-v0-Instruct-7B on MATH, d1's settings (--data: MATH train file)."),
        _dream("dream-7b-countdown", "countdown", "Dream-v0-Instruct-7B on Countdown (procedural), d1's settings."),
        _dream("dream-7b-sudoku", "sudoku", "Dream-v0-Instruct-7B AIS-GRPO on 4x4 Sudoku (procedural), d1's settings."),
        # tiny-qwen: was arith with 300 SFT steps (5.5 of 6.2 minutes in SFT, reward falling over the RL steps); now
        # tiny-cpu's recipe (digits shift, SFT 40 steps, β 0.04) at lr 1e-3, one seed measured (docs/cpu.md, Qwen).
        Preset("tiny-qwen", "Tiny autoregressive Qwen3 on CPU: SFT warm-up on digits, AIS-GRPO with FP8 rollouts.",
               ModelConfig(family="qwen"), SamplerConfig(gen_length=5, block_length=5, steps=5, temperature=1.0),
               TrainConfig(task="digits", task_config={"op": "shift", "length": 4}, steps=100, prompts_per_step=16,
                           learning_rate=1e-3, sft_steps=40),
               GRPOConfig(num_generations=8, beta=0.04, max_completion_length=5, num_iterations=2),
               CorrectionConfig(correction_level="token", ais_tau=0.05)),
        _qwen("qwen3-8b-gsm8k", "gsm8k", "Qwen3-8B AIS-GRPO on GSM8K with FP8 rollouts (token-level AIS)."),
        _qwen("qwen3-8b-math", "math500", "Qwen3-8B AIS-GRPO on MATH with FP8 rollouts (--data MATH train file)."),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`, or an error listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}.")
    return PRESETS[name]
