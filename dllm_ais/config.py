"""Frozen configuration dataclasses (one per component); the named presets are in dllm_ais/presets.py.

Every field has a docstring; `__post_init__` rejects bad values with a message that says what to change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from dllm_ais.families import FAMILIES, foreign_policy_logprob, foreign_sampler_setting, get_family
from dllm_ais.rl.config import CorrectionConfig, GRPOConfig

REMASKING = ("low_confidence", "random")
CACHE_MODES = ("none", "prefix", "dual")
CUDA_GRAPH_MODES = ("auto", "on", "off")  # samplers.cuda_graphs.MODES (not imported here: config stays light)
POSITION_RULES = tuple(dict.fromkeys(r for f in FAMILIES.values() for r in f.position_rules))
"""Every family's named position rules (--dream-alg: Dream's `alg` values, models/dream/family.py)."""
SDAR_STRATEGIES = ("low_confidence_static", "low_confidence_dynamic", "sequential")
"""Block diffusion's commit rules (SDAR `block_diffusion_generate`; models/sdar/selection.py is their law)."""
MISMATCH_ESTIMATORS = ("elbo", "trajectory")
POLICY_LOGPROBS = ("one_step", "trajectory", "elbo", "coupled", "spg", "mdpo", "dtreerpo", "ebpo")
"""--policy-logprob names; a family may own some (Family.own_policy_logprobs: SDAR's ebpo), refused for the others."""
ELBO_SCHEMES = ("stratified", "antithetic", "quadrature")
RATIO_LEVELS = ("sequence", "token")
DTYPES = ("float32", "bfloat16", "float16", "float64")
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "aim", "clearml", "dvclive", "swanlab")
"""accelerate's experiment trackers (accelerate.tracking.LOGGER_TYPE_TO_CLASS), the names `report_to` takes."""


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how."""

    family: str = "llada"
    """Model family, a key of dllm_ais/families.py's registry: `llada` (masked diffusion, our LLaDAModelLM), `dream`
    (masked diffusion with shifted logits, our DreamModel) or `qwen` (autoregressive Qwen2/Qwen3 through
    transformers). Chooses the sampler, likelihoods and checkpoint format."""
    path: str | None = None
    """Local checkpoint directory (LLaDA: official layout; Qwen: save_pretrained layout) or hub id.
    None = the family's tiny built-in model."""
    dtype: str = "float32"
    """Parameter dtype of the BF16 trainer copy: one of float32, bfloat16, float16, float64."""
    device: str = "cpu"
    """torch device string, e.g. cpu or cuda."""
    seed: int = 0
    """Seed for the tiny model's random initialisation (ignored when `path` is set)."""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family={self.family!r}: use one of {', '.join(FAMILIES)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype={self.dtype!r}: use one of {', '.join(DTYPES)}.")


@dataclass(frozen=True)
class SamplerConfig:
    """Masked-diffusion sampling (LLaDA `generate` semantics)."""

    gen_length: int = 32
    """Completion length L (tokens appended as masks after the prompt)."""
    block_length: int = 32
    """Semi-autoregressive block size; gen_length must be a multiple of it. block_length = gen_length: one block."""
    steps: int = 16
    """Total denoising steps, split evenly over the blocks; must be a multiple of the number of blocks."""
    temperature: float = 0.0
    """Gumbel-max temperature (float64); 0 = argmax (deterministic)."""
    remasking: str = "low_confidence"
    """Which masked positions to commit each step: low_confidence (highest softmax prob first) or random."""
    cfg_scale: float = 0.0
    """Classifier-free guidance scale; 0 disables it (one forward per step instead of two)."""
    compile: bool = True
    """On CUDA, run the per-step forward through torch.compile(mode="reduce-overhead"): fused kernels and CUDA graphs
    (a step's shapes are static across the whole rollout). Ignored on CPU. False = eager (no compile time)."""
    cache: str = "none"
    """Fast-dLLM block KV cache: `none` (every step a full forward), `prefix` (one refresh forward per block caches
    K/V before the block; later steps recompute the block and what follows), `dual` (the refresh caches every
    position; later steps recompute the current block only)."""
    threshold: float | None = None
    """Confidence-threshold parallel decoding (Fast-dLLM): each step commits every masked position of the current
    block whose confidence >= threshold, and at least the most confident one; a block ends when it has no mask left.
    None = LLaDA's fixed schedule (steps / num_blocks steps per block)."""
    max_commit_per_step: int | None = None
    """Threshold decoding only: commit at most this many tokens per step (the most confident of those at or above
    the threshold; the most confident one is still always committed). A safeguard against many near-certain tokens
    committed at once (d1 issue 25); the trajectory likelihood's selection terms model the cap. None = no cap."""

    cuda_graphs: str = "auto"
    """CUDA graphs for the sampler's forwards (samplers/diffusion_graphs.py): each static-shape step — the whole-canvas
    step or refresh, the dual / prefix window step — is captured once per (batch, shape) and replayed, which removes
    the per-kernel launch cost that bounds small steps (the FP8 window step). `auto` = on for CUDA rollouts, eager
    elsewhere or (with a warning) where a capture fails; `on` = graphs or a one-line refusal (not CUDA, not a module);
    `off` = never. Same results as eager up to kernel choice; with `compile` the compiled step is captured."""
    dream_alg: str | None = None
    """Dream's position rule (overrides `remasking`): origin (random order), maskgit_plus (top-1 probability),
    topk_margin (top-1 − top-2) or entropy (Dream's own evaluation rule). None = from `remasking`: random → origin,
    low_confidence → the checkpoint's generation_config.json alg when it is a confidence rule, else maskgit_plus
    (never the hub's "origin"). A run writes the rule it resolved here (models/dream/backend.py)."""
    dream_alg_temp: float | None = None
    """Dream's alg_temp: 0 = commit the most confident positions, > 0 = draw them from softmax(confidence / alg_temp);
    None = the checkpoint's generation_config.json alg_temp, else 0."""
    sdar_strategy: str | None = None
    """Block diffusion (SDAR) only: which masked slots of the block a step commits — low_confidence_static (the
    step's quota, most confident first), low_confidence_dynamic (every slot with confidence > sdar_threshold when
    they reach the quota, else the quota's most confident), sequential (the quota's leftmost). None = the family's
    default (SDAR: low_confidence_dynamic). Other families refuse it."""
    sdar_threshold: float | None = None
    """Block diffusion (SDAR) only: τ of low_confidence_dynamic, in (0, 1) (None = the family's default, SDAR 0.9:
    TraDo's rollout setting). Other families refuse it."""

    def __post_init__(self):
        if self.gen_length < 1 or self.block_length < 1 or self.steps < 1:
            raise ValueError("gen_length, block_length and steps must all be >= 1.")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length={self.gen_length} is not a multiple of block_length={self.block_length}; "
                             "change one of them.")
        num_blocks = self.gen_length // self.block_length
        if self.steps % num_blocks:
            raise ValueError(f"steps={self.steps} must be a multiple of the number of blocks ({num_blocks} = "
                             f"gen_length/block_length).")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0.")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking={self.remasking!r}: use one of {', '.join(REMASKING)}.")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0.")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"SamplerConfig.cuda_graphs={self.cuda_graphs!r}: use one of "
                             f"{', '.join(CUDA_GRAPH_MODES)}.")
        if self.cache not in CACHE_MODES:
            raise ValueError(f"SamplerConfig.cache={self.cache!r}: use one of {', '.join(CACHE_MODES)}.")
        if self.dream_alg is not None and self.dream_alg not in POSITION_RULES:
            raise ValueError(f"SamplerConfig.dream_alg={self.dream_alg!r}: use one of {', '.join(POSITION_RULES)}.")
        if self.dream_alg_temp is not None and not self.dream_alg_temp >= 0:
            raise ValueError(f"SamplerConfig.dream_alg_temp={self.dream_alg_temp} must be >= 0 (0 = the most "
                             "confident positions).")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"SamplerConfig.threshold={self.threshold} must be in (0, 1] (or None: fixed schedule).")
        if self.sdar_strategy is not None and self.sdar_strategy not in SDAR_STRATEGIES:
            raise ValueError(f"SamplerConfig.sdar_strategy={self.sdar_strategy!r}: use one of "
                             f"{', '.join(SDAR_STRATEGIES)}.")
        if self.sdar_threshold is not None and not 0.0 < self.sdar_threshold < 1.0:
            raise ValueError(f"SamplerConfig.sdar_threshold={self.sdar_threshold} must be in (0, 1).")
        if self.max_commit_per_step is not None:
            if self.threshold is None:
                raise ValueError(f"SamplerConfig.max_commit_per_step={self.max_commit_per_step} caps threshold "
                                 "decoding; the fixed schedule has no threshold: add --threshold F or drop the cap.")
            if self.max_commit_per_step < 1:
                raise ValueError(f"SamplerConfig.max_commit_per_step={self.max_commit_per_step} must be >= 1.")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length


@dataclass(frozen=True)
class PolicyLikelihoodConfig:
    """Settings of the mask-draw policy likelihoods (dllm_ais/likelihood/policy.py; docs/likelihoods.md), given whole
    to the backend. Which one is used is TrainConfig.policy_logprob."""

    elbo_draws: int = 2
    """K mask draws per sequence of `elbo`, `spg` and SDAR's `ebpo` (forward rows per sequence; memory does not grow
    with K for LLaDA's and Dream's; SDAR's keep every draw's graph)."""
    elbo_scheme: str = "stratified"
    """`elbo`'s draws: stratified (VRPO/BGPO: K counts over 1..L from one offset, weight L/x), antithetic (ESPO: a
    mask and its complement, weights (L+1)/count, counts stratified over the group; even K) or quadrature (GDPO:
    t = 0.211 / 0.789, Gauss weights ½, |M| = round(L t) >= 1; even K)."""
    elbo_ratio_level: str = "sequence"
    """`elbo`'s GRPO ratio: sequence (ESPO/GDPO: exp((ELBO − ELBO_old)/L), GSPO's ratio, clipped at ε) or token
    (the ELBO's per-token terms, each its own ratio). Sets GRPOConfig.importance_sampling_level."""
    coupled_t_min: float = 0.2
    """`coupled` (DiffuCoder): the mask rate t ~ U(coupled_t_min, coupled_t_max), drawn once per batch."""
    coupled_t_max: float = 0.8
    """`coupled`: upper end of t's range."""
    spg_beta: float = 1.5
    """`spg`: the EUBO's exponent β (> 0)."""
    spg_mix: float | None = None
    """`spg`: None = the EUBO for Â ≤ 0; w in [0, 1] = the mixture w·EUBO + (1 − w)·ELBO for them (SPG: 0.5)."""
    spg_block_length: int | None = None
    """`spg`: block length of the block-random masks; None = the sampler's block_length."""
    spg_block_rule: str = "permutation"
    """`spg`: each draw's block: permutation (SPG: draws take a random permutation of the blocks) or independent."""
    spg_p_mask_prompt: float = 0.3
    """`spg`: probability of masking each prompt token and each token of the blocks before the chosen one (SPG's
    config and GSM8K recipe: 0.3; DARE uses d1's 0.15)."""
    mdpo_steps: int = 16
    """`mdpo`: the rollout's canvases x_t scored per sequence, at most (MDPO's sample_train_steps: 16)."""
    mdpo_confidence: bool = True
    """`mdpo`: weight each token by the probability the sampler committed it with (MDPO); False = weight 1."""
    dtreerpo_segments: int = 2
    """`dtreerpo`: segments s of the rollout's T steps, cut at int(k·T/s) (d-TreeRPO's branch points: s = 2)."""
    mask_tail: bool = True
    """Post-EOS positions shown as mask tokens (the sampler's blank canvas) rather than as themselves; never scored."""
    batch_size: int = 64
    """Forward rows per model call."""

    def __post_init__(self):
        for name in ("elbo_draws", "mdpo_steps", "dtreerpo_segments"):
            if isinstance(v := getattr(self, name), bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: need an int >= 1 (mask draws, canvases or segments per sequence).")
        for name, choices in (("elbo_scheme", ELBO_SCHEMES), ("elbo_ratio_level", RATIO_LEVELS),
                              ("spg_block_rule", ("permutation", "independent"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r}: use one of {', '.join(choices)}.")
        if self.elbo_scheme != "stratified" and self.elbo_draws % 2:
            raise ValueError(f"elbo_draws={self.elbo_draws} with elbo_scheme {self.elbo_scheme}: needs an even K "
                             "(antithetic: a mask and its complement; quadrature: 2 nodes); pass an even --elbo-draws.")
        if not 0.0 < self.coupled_t_min <= self.coupled_t_max < 1.0:
            raise ValueError(f"coupled t range ({self.coupled_t_min}, {self.coupled_t_max}): need 0 < min <= max < 1.")
        if not self.spg_beta > 0:
            raise ValueError(f"spg_beta={self.spg_beta}: the EUBO exponent must be > 0 (SPG: 1.5).")
        if self.spg_mix is not None and not 0.0 <= self.spg_mix <= 1.0:
            raise ValueError(f"spg_mix={self.spg_mix}: the mixture weight must be in [0, 1] (or None: the EUBO alone).")
        if self.spg_block_length is not None and self.spg_block_length < 1:
            raise ValueError(f"spg_block_length={self.spg_block_length} must be >= 1 (or None: the sampler's).")
        if not 0.0 <= self.spg_p_mask_prompt < 1.0:
            raise ValueError(f"spg_p_mask_prompt={self.spg_p_mask_prompt} must be in [0, 1).")
        if self.batch_size < 1:
            raise ValueError(f"PolicyLikelihoodConfig.batch_size={self.batch_size} must be >= 1.")


ROLLOUT_PRECISIONS = ("bf16", "fp8", "fp4")
FP4_FORMATS = ("nvfp4", "mxfp4")  # dllm_ais.fp4.FORMATS (not imported here: config stays light)


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: data, optimisation, rollout precision, warm-up, checkpoints."""

    task: str = "arith"
    """Task name (dllm_ais.tasks registry): digits, arith, gsm8k, math500, countdown, sudoku."""
    task_config: dict = field(default_factory=dict)
    """Fields of a procedural task's generator config, e.g. {"max_operand": 9} for arith ({} = the task's defaults)."""
    data_path: str | None = None
    """Local jsonl/parquet file for the task's training split; None = hub dataset or procedural generator."""
    reward_fn: str | list[str] | None = None
    """TRL-style reward function(s) by import path ('pkg.module:func'; a list for several), used instead of the
    task's reward; called as TRL calls them (dllm_ais/train/rewards.py)."""
    reward_weights: list[float] | None = None
    """One weight per reward_fn entry (None: all 1.0); the step's reward is the weighted sum, TRL's reward_weights."""
    steps: int = 40
    """Number of GRPO steps (each: rollouts, rewards, num_iterations optimizer updates, FP8 sync)."""
    prompts_per_step: int = 8
    """Prompts per step and process; each is sampled num_generations times."""
    learning_rate: float = 3e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up (optimizer updates); constant afterwards."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    gradient_accumulation_steps: int = 1
    """Split each update's batch into this many micro-batches (memory); one optimizer step per update."""
    rollout_precision: str = "fp8"
    """Rollout policy μ: `fp8` (FP8 copy of the master, resynced after every step), `fp4` (emulated W4A4 FP4 copy,
    resynced likewise; numerics only, no speedup without Blackwell FP4 tensor cores) or `bf16` (the master itself)."""
    fp8_backend: str = "torch"
    """FP8 GEMM backend of the rollout copy: torch (reference, CPU), triton, cublas, scaled_mm, torchao, or auto
    (timed once per layer shape when the copy is built; cuBLAS kept unless clearly slower — the LLaDA GPU presets)."""
    fp4_format: str = "nvfp4"
    """FP4 format of an `fp4` rollout copy: nvfp4 (16-blocks, e4m3 + fp32 scales) or mxfp4 (32-blocks, e8m0 scales)."""
    mismatch_num_draws: int = 4
    """K mask draws of the coupled ELBO estimate of ℓ = log π_old − log μ (diffusion backends)."""
    mismatch_estimator: str = "elbo"
    """Diffusion backends' sequence log-ratio ℓ: `elbo` (coupled MC-ELBO difference on shared masks; blind to what
    the sampler does) or `trajectory` (replay of the recorded denoising canvases under π_old: Σ over committed tokens
    of log π_old − log μ; sees the KV cache and threshold decoding)."""
    trajectory_steps: int | None = None
    """`trajectory` estimator: replay only this many denoising steps per sequence, drawn at random and scaled
    (Horvitz–Thompson, unbiased); None = every step."""
    policy_logprob: str = "one_step"
    """Diffusion backends' log π in the GRPO ratio (and the KL when β > 0): `one_step` (d1's estimator: every
    completion token masked at once, one forward), `trajectory` (the replay of the rollout's recorded canvases under
    θ with gradients, with the rollout sampler's cache and temperature: the likelihood of the path actually sampled;
    `trajectory_steps` subsamples it, `trajectory_selection` adds the choice of positions), `elbo` (sequence ELBO,
    ESPO/GDPO/VRPO), `coupled` (DiffuCoder's three-pass per-token estimator), `spg` (SPG's ELBO/EUBO bounds, its
    own loss: no ratio, no clip, β = 0), `mdpo` (MDPO: the rollout's canvases x_t, λ_t- and confidence-weighted) or
    `dtreerpo` (d-TreeRPO: each segment's tokens at the segment's first canvas); SDAR only: `ebpo` (EBPO's
    composite ELBO, every block masked in every draw, its sequence ratio exp(ELBO − ELBO_old)). Settings:
    `likelihood`."""
    likelihood: PolicyLikelihoodConfig = field(default_factory=PolicyLikelihoodConfig)
    """Settings of the mask-draw policy likelihoods (a dict in config.json)."""
    trajectory_selection: bool = False
    """Trajectory likelihoods (policy and mismatch ratio) include each step's selection term (which positions the
    sampler committed: top-k confidence or threshold); False = the commit-only likelihood. Off by default: the
    term makes ℓ far noisier under FP8/FP4 rollouts (docs/fast-rollouts.md, "The selection term")."""
    trajectory_merge: int = 1
    """`trajectory` policy likelihood: score this many consecutive recorded steps (per block) in one forward from the
    canvas at the group's first step, as TraceRL's `shrink` and d2's StepMerge do: biased, about this many times
    fewer replay rows; 1 = the exact replay (likelihood.trajectory.merge_commit_steps)."""
    p_mask_prompt: float = 0.15
    """d1 one-step estimator: probability of masking each prompt token (same mask for θ, π_old and reference)."""
    lora_r: int = 0
    """LoRA rank (peft) on every block linear; 0 = full fine-tuning."""
    lora_alpha: float = 64.0
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout. Keep 0 for RL: dropout is active for π_θ but not for π_old (ratio ≠ 1 at the first iteration)
    and draws from torch's global RNG (breaks resume reproducibility)."""
    sft_steps: int = 0
    """Masked-diffusion SFT warm-up steps before GRPO (built-in task only needs this); 0 = none."""
    sft_batch_size: int = 64
    """SFT batch size."""
    sft_learning_rate: float = 3e-3
    """SFT learning rate (AdamW)."""
    save_every: int = 0
    """Write a checkpoint every this many steps and keep each (0 = none by step count)."""
    save_every_minutes: float = 10.0
    """Also write a checkpoint when this many minutes of wall time have passed since the last one (or since the run
    started), so a killed run loses at most this much; 0 = off. Checkpoints are also written at the end and when
    the run is stopped (Ctrl-C, SIGTERM, SIGUSR1)."""
    keep_checkpoints: int = 3
    """Keep the newest this many checkpoints, deleting older ones as new ones are written; those at a multiple of
    save_every are always kept. 0 = keep every one."""
    seed: int = 0
    """Seed for data order, rollouts and estimator noise (every random draw derives from it and the step)."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that also get every step's metrics, through accelerate's trackers (TRL's report_to): any of
    TRACKERS; tensorboard writes <out>/logs/. metrics.jsonl is always written and is the source of truth."""
    grad_diagnostics_every: int = 0
    """Every this many steps (0 = never), measure how far the correction moves the policy gradient against the
    minibatch noise (grad/correction_shift, grad/noise, grad/shift_to_noise; dllm_ais/train/grad_diagnostics.py):
    three extra forward + backward passes on those steps, the update unchanged. One process, ≥ 2 prompts per step."""

    def __post_init__(self):
        if isinstance(self.likelihood, dict):  # from config.json
            object.__setattr__(self, "likelihood", PolicyLikelihoodConfig(**self.likelihood))
        for name in ("steps", "prompts_per_step", "gradient_accumulation_steps", "mismatch_num_draws",
                     "sft_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)} must be >= 1.")
        for name in ("warmup_steps", "sft_steps", "save_every", "lora_r", "grad_diagnostics_every",
                     "save_every_minutes", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)} must be >= 0.")
        if self.rollout_precision not in ROLLOUT_PRECISIONS:
            raise ValueError(f"TrainConfig.rollout_precision={self.rollout_precision!r}: use one of "
                             f"{', '.join(ROLLOUT_PRECISIONS)}.")
        if self.fp4_format not in FP4_FORMATS:
            raise ValueError(f"TrainConfig.fp4_format={self.fp4_format!r}: use one of {', '.join(FP4_FORMATS)}.")
        if not 0.0 <= self.p_mask_prompt < 1.0:
            raise ValueError(f"TrainConfig.p_mask_prompt={self.p_mask_prompt} must be in [0, 1).")
        if self.learning_rate <= 0 or self.sft_learning_rate <= 0:
            raise ValueError("learning rates must be > 0.")
        if self.mismatch_estimator not in MISMATCH_ESTIMATORS:
            raise ValueError(f"TrainConfig.mismatch_estimator={self.mismatch_estimator!r}: use one of "
                             f"{', '.join(MISMATCH_ESTIMATORS)}.")
        if self.policy_logprob not in POLICY_LOGPROBS:
            raise ValueError(f"TrainConfig.policy_logprob={self.policy_logprob!r}: use one of "
                             f"{', '.join(POLICY_LOGPROBS)}.")
        if self.trajectory_steps is not None and self.trajectory_steps < 1:
            raise ValueError(f"TrainConfig.trajectory_steps={self.trajectory_steps} must be >= 1 (or None: all).")
        self._check_trajectory_merge()
        unknown = [t for t in self.report_to if t not in TRACKERS]
        if unknown:
            raise ValueError(f"TrainConfig.report_to {' '.join(unknown)}: unknown tracker; use any of "
                             f"{', '.join(TRACKERS)}.")
        if self.grad_diagnostics_every and self.prompts_per_step < 2:
            raise ValueError(f"TrainConfig.grad_diagnostics_every needs prompts_per_step >= 2 (the noise estimate "
                             f"splits the batch's prompt groups in two), got {self.prompts_per_step}; raise it or "
                             "set grad_diagnostics_every to 0.")

    def _check_trajectory_merge(self) -> None:
        """--trajectory-merge N > 1 merges the steps of the trajectory policy likelihood: nothing else reads it."""
        if self.trajectory_merge < 1:
            raise ValueError(f"TrainConfig.trajectory_merge={self.trajectory_merge} must be >= 1 (1 = exact replay).")
        if self.trajectory_merge == 1:
            return
        if self.policy_logprob != "trajectory":
            raise ValueError("--trajectory-merge merges the steps of the trajectory policy likelihood: add "
                             "--policy-logprob trajectory or drop --trajectory-merge.")
        if self.trajectory_steps is not None or self.trajectory_selection:
            raise ValueError("--trajectory-merge > 1 replays every merged step without selection terms: drop "
                             "--trajectory-steps / --trajectory-selection on, or use --trajectory-merge 1.")


@dataclass(frozen=True)
class Preset:
    """A named bundle of component configs."""

    name: str
    """Preset name used on the command line (--preset)."""
    description: str
    """One line shown by `dllm-ais --help`."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model to load."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Sampling settings for rollouts and `dllm-ais sample`."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop settings."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO loss and advantages."""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """FP8 mismatch correction (AIS by default)."""

    @property
    def objective(self) -> str:
        """What the run optimises, in a few words: "AIS-GRPO", "GRPO" (no correction), "TIS-GRPO" ..., or "SPG" (its
        own loss; the correction still weights it)."""
        correction = self.correction.correction
        if self.train.policy_logprob == "spg":
            return "SPG" if correction == "none" else f"SPG ({correction.upper()})"
        return "GRPO" if correction == "none" else f"{correction.upper()}-GRPO"

    def summary(self) -> str:
        """One line naming what a run of this preset does: model, objective, policy likelihood, mismatch ratio,
        rollouts (printed when a run starts and ends; four estimator runs never look alike)."""
        family = get_family(self.model.family)
        model = f"{family.title} {self.model.path or '(tiny built-in)'}"
        likelihood = self.train.policy_logprob if family.diffusion else "exact (autoregressive)"
        if self.train.policy_logprob in ("elbo", "spg", "ebpo") and family.diffusion:
            likelihood += f" K={self.train.likelihood.elbo_draws}"
        mismatch = f", mismatch ℓ {self.train.mismatch_estimator}" if family.diffusion else ""
        return (f"{self.name}: {model}; {self.objective}, policy likelihood {likelihood}{mismatch}; "
                f"{self.train.rollout_precision.upper()} rollouts; {self.train.steps} steps")

    def __post_init__(self):
        if self.correction.train_forward == "aligned" and self.train.rollout_precision != "fp8":
            raise ValueError("--train-forward aligned fake-quantises the training forward like the FP8 rollout copy; "
                             "it needs --rollout-precision fp8 (or use --train-forward bf16).")
        family = get_family(self.model.family)
        if why := foreign_sampler_setting(family, self.sampler) or foreign_policy_logprob(family,
                                                                                           self.train.policy_logprob):
            raise ValueError(why)
        # what the family's sampler cannot run comes first: advice about estimators is moot for such a sampler
        if family.refusal is not None and (why := family.refusal(self.sampler, self.train.policy_logprob,
                                                                 self.train.mismatch_estimator,
                                                                 self.train.trajectory_steps)):
            raise ValueError(why)
        if family.diffusion:
            self._check_mismatch_estimator()
            self._check_policy_logprob()
        if self.grpo.max_completion_length < self.sampler.gen_length:
            object.__setattr__(self, "grpo", replace(self.grpo, max_completion_length=self.sampler.gen_length))

    def _check_mismatch_estimator(self) -> None:
        """Diffusion: the ELBO ratio cannot see a cache or threshold; the trajectory ratio needs a density (T > 0)."""
        fast = self.sampler.cache != "none" or self.sampler.threshold is not None
        if fast and self.train.mismatch_estimator == "elbo":
            used = [f"--cache {self.sampler.cache}"] * (self.sampler.cache != "none") + [
                f"--threshold {self.sampler.threshold}"] * (self.sampler.threshold is not None)
            raise ValueError(f"{' with '.join(used)} changes the rollout sampler, which the ELBO mismatch estimator "
                             "cannot see: pass --mismatch-estimator trajectory.")
        if self.train.trajectory_steps is not None and self.correction.correction_level == "token":
            raise ValueError("--trajectory-steps subsamples the sequence sum of ℓ (unbiased for sequence and geometric "
                             "levels); per-token weights need every step: drop --trajectory-steps or use "
                             "--correction-level sequence|geometric.")
        if self.train.mismatch_estimator == "trajectory" and self.sampler.temperature == 0:
            raise ValueError("--mismatch-estimator trajectory needs a sampling density: --temperature 0 (greedy) has "
                             "none; sample at T > 0 or use --mismatch-estimator elbo.")

    def _check_policy_logprob(self) -> None:
        """The trajectory policy likelihood needs a density (T > 0); Horvitz–Thompson weights act per token; `elbo`
        sets the ratio level, `ebpo` EBPO's summed sequence ratio; `spg` trains without a KL term."""
        name = self.train.policy_logprob
        if name == "elbo":
            level = self.train.likelihood.elbo_ratio_level
            object.__setattr__(self, "grpo", replace(self.grpo, importance_sampling_level=level))
        if name == "ebpo":
            if self.grpo.loss_type in ("tbpo", "cispo"):
                raise ValueError(f"--policy-logprob ebpo trains on EBPO's sequence ratio exp(ELBO − ELBO_old); "
                                 f"--loss-type {self.grpo.loss_type} has a ratio of its own (tbpo: GSPO's mean, "
                                 "cispo: per token): use --loss-type grpo (EBPO's per-sequence mean), dapo, bnpo or "
                                 "dr_grpo.")
            object.__setattr__(self, "grpo", replace(self.grpo, importance_sampling_level="sequence_sum"))
        if name == "spg" and self.grpo.beta != 0:
            raise ValueError(f"--policy-logprob spg with β = {self.grpo.beta} (GRPOConfig.beta): SPG trains without a "
                             "KL term; set it to 0 (--beta 0; `dllm-ais train --policy-logprob spg` does so itself "
                             "unless --beta is given).")
        if name != "trajectory":
            return
        if self.sampler.temperature == 0:
            raise ValueError("--policy-logprob trajectory needs a sampling density: the rollouts are greedy "
                             "(temperature 0); sample at T > 0 or use --policy-logprob one_step.")
        gspo = self.grpo.importance_sampling_level == "sequence" or self.grpo.loss_type == "tbpo"
        if self.train.trajectory_steps is not None and gspo:
            raise ValueError("--trajectory-steps with a sequence-level ratio (GSPO / --loss-type tbpo): the mean "
                             "log-ratio of a subsample of steps is not an unbiased one; drop --trajectory-steps or use "
                             "a token-level ratio.")

    def to_dict(self) -> dict:
        """Plain nested dict (written to <out>/config.json)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Preset:
        """Inverse of to_dict; unknown keys raise naming the section."""
        parts = {"model": ModelConfig, "sampler": SamplerConfig, "train": TrainConfig, "grpo": GRPOConfig,
                 "correction": CorrectionConfig}
        kwargs = {"name": data["name"], "description": data.get("description", "")}
        for key, cls_ in parts.items():
            section = data.get(key, {})
            known = {f.name for f in fields(cls_)}
            unknown = set(section) - known
            if unknown:
                raise ValueError(f"config section {key!r} has unknown field(s) {sorted(unknown)}.")
            kwargs[key] = cls_(**section)
        return cls(**kwargs)


def override(cfg, **changes):
    """`dataclasses.replace` that ignores None values and names unknown fields clearly."""
    known = {f.name for f in fields(cfg)}
    bad = set(changes) - known
    if bad:
        raise ValueError(f"{type(cfg).__name__} has no field(s) {sorted(bad)}; known: {sorted(known)}.")
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})


def with_block_length(sampler: SamplerConfig, block: int) -> SamplerConfig:
    """`sampler` with blocks of `block` and the same steps per token (at least one step a block); a generation length
    that is not a whole number of blocks is refused in one line."""
    if sampler.block_length == block:
        return sampler
    if sampler.gen_length % block:
        raise ValueError(f"--gen-length {sampler.gen_length}: this model samples in blocks of {block} (the block it "
                         f"was trained with); use a multiple of {block}.")
    blocks = sampler.gen_length // block
    per_block = max(1, round(sampler.steps * block / sampler.gen_length))
    return replace(sampler, block_length=block, steps=per_block * blocks)
