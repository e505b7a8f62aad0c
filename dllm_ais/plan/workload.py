"""What one RL step runs on one GPU process: the preset's numbers (`Workload`) and every model forward of the step
(`Pass`), as train/trainer.py, train/backend.py, samplers/diffusion.py and likelihood/ run them.

Per process (accelerate: every process rolls out its own prompts_per_step prompts), one step is
  rollout      NFE sampler forwards of the B = prompts × G rows on the rollout policy μ (the FP8/FP4 copy or the
               master); without a cache each is the whole canvas [B, P + L], logits of the current block only; with
               Fast-dLLM's prefix / dual cache a block's first step is the full canvas and its later steps a window.
  likelihood   π_old: num_iterations one-step forwards [B, P + L] on the master (on μ with --bypass); log μ on the
               same masks: one on the rollout copy; ℓ: the coupled ELBO (K draws × B rows on each of master and copy,
               64 rows per call) or the trajectory replay (B × replayed steps rows on the master); the reference
               (β > 0): num_iterations one-step forwards (the adapter-free base with LoRA, a frozen copy otherwise).
  train        num_iterations updates, each a forward + backward of the policy likelihood over the B rows, in
               gradient_accumulation_steps micro-batches; one AdamW step per update.

The policy likelihood (--policy-logprob) sets how many canvases one evaluation scores per sequence: one_step 1, elbo
and spg K draws, coupled 3 (DiffuCoder's three passes), mdpo min(--mdpo-steps, steps) recorded canvases, dtreerpo
min(--dtreerpo-segments, steps) segments, trajectory the replayed steps (÷ --trajectory-merge). Mask-draw
estimators run each (draw, 64-row chunk) as one call and, with gradients, checkpoint it (the forward runs again in
backward: memory flat in K); a trajectory replay runs chunks of the batch's rows, checkpointed likewise, and its π_old
and reference are evaluated once per step (one replay serves every iteration). Coupled, mdpo, dtreerpo and trajectory
skip canvases with nothing to score (a complement without masks, a canvas or segment with no counted token, a step
that committed nothing), so for them the rows are upper bounds; for one_step, elbo and spg they are exact
(tests/test_plan_measured.py counts them).
  sync         the rollout copy requantised from the master (none for bf16 rollouts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dllm_ais.families import get_family

ELBO_ROWS_PER_CALL = 64
"""likelihood/elbo.py DEFAULT_BATCH_SIZE: rows of one model call of the mismatch ELBO."""
DRAW_ROWS_PER_CALL = 64
"""likelihood/mask_draws.py draw_logprobs' batch_size: rows of one call of a mask-draw policy likelihood."""
PROMPT_BUCKET = 64
"""samplers/diffusion.py PROMPT_BUCKET: compiled sampling (CUDA) left-pads prompts to a multiple of this."""


@dataclass(frozen=True)
class Workload:
    """The numbers of one RL step on one process."""

    rows: int
    """B: rows per process and step (prompts_per_step × num_generations)."""
    prompt_len: int
    """P: prompt tokens (left-padded batch width) of the likelihood and training passes."""
    rollout_prompt_len: int
    """Prompt tokens of the rollout canvas (P rounded up to PROMPT_BUCKET when the sampler is compiled or graphed on
    CUDA)."""
    gen_length: int
    """L: completion tokens."""
    block_length: int
    """Lb: semi-autoregressive block; the sampler computes logits for the current block only."""
    sampler_steps: int
    """Denoising steps of the fixed schedule (with a threshold: an upper bound on NFE)."""
    cache: str
    """Fast-dLLM cache: none, prefix or dual."""
    threshold: float | None
    """Threshold decoding (NFE then depends on the model's confidence; the fixed schedule bounds it)."""
    cfg: bool
    """Classifier-free guidance: a second (unconditional) forward per step."""
    temperature: float
    """Sampling temperature (T > 0: Gumbel-max noise in float64; 0: argmax)."""
    remasking: str
    """low_confidence (a float64 softmax per step) or random."""
    rollout_precision: str
    """bf16 (the master rolls out), fp8 or fp4."""
    param_bytes: int
    """Bytes per master parameter as stored (2 bf16, 4 fp32: FSDP full fine-tuning keeps fp32 shards)."""
    act_bytes: int
    """Bytes per activation element of the master's forward (its compute dtype: bf16 under FSDP mixed precision)."""
    lora_r: int
    """LoRA rank (0 = full fine-tuning)."""
    micro_batches: int
    """gradient_accumulation_steps: micro-batches per update."""
    num_iterations: int
    """Updates per step (GRPO μ); π_old and the reference run once per update."""
    beta: float
    """KL coefficient (> 0: reference log-probs every update)."""
    mismatch: str
    """How ℓ is computed: none (μ = π_old: bf16 rollouts or --bypass), elbo (coupled ELBO, sequence level),
    trajectory (replay), or onestep (token / geometric levels: the log π_old − log μ already computed)."""
    mismatch_draws: int
    """K of the coupled ELBO."""
    trajectory_steps: int | None
    """Replayed denoising steps per sequence (None = every step)."""
    bypass: bool
    """π_old := μ (no BF16 old-policy pass)."""
    gpus: int
    """Processes (one GPU each)."""
    fsdp: bool
    """FSDP2 shards master, gradients and optimizer over the gpus (full fine-tuning); else DDP or one process."""
    gradient_checkpointing: bool
    """Recompute each block in backward (models/llada/model.py supports it; `dllm-ais train` does not switch it on
    yet)."""
    train_steps: int
    """RL steps of the run (for the run's total time)."""
    policy: str = "one_step"
    """The policy likelihood (TrainConfig.policy_logprob): one_step, elbo, coupled, spg, mdpo, dtreerpo or
    trajectory."""
    policy_draws: int = 1
    """Canvases it scores per sequence and evaluation (module docstring)."""
    trajectory_merge: int = 1
    """--trajectory-merge: consecutive sampler steps scored in one replayed canvas."""
    family: str = "llada"
    """Model family (ModelConfig.family; dllm_ais/families.py)."""
    replay_steps: int | None = None
    """Canvases a trajectory replay scores per sequence: the steps that commit (the family's `plan_commit_steps`),
    or --trajectory-steps K of them; None = every sampler step."""

    @property
    def canvas(self) -> int:
        return self.prompt_len + self.gen_length

    @property
    def rollout_canvas(self) -> int:
        return self.rollout_prompt_len + self.gen_length

    @property
    def micro_rows(self) -> int:
        """Rows of the largest micro-batch (torch.tensor_split: the first ones take the remainder)."""
        return math.ceil(self.rows / self.micro_batches)

    @property
    def trainable(self) -> str:
        return "lora" if self.lora_r else "full"

    @property
    def policy_checkpointed(self) -> bool:
        """The update checkpoints each call of the policy likelihood (every estimator but one_step)."""
        return self.policy != "one_step"

    @property
    def update_rows(self) -> int:
        """Rows whose activations the update keeps at once: a micro-batch, or one checkpointed mask-draw call."""
        if self.policy not in ("one_step", "trajectory"):  # a mask-draw likelihood
            return min(self.micro_rows, DRAW_ROWS_PER_CALL)
        return self.micro_rows


@dataclass(frozen=True)
class Pass:
    """Forward calls of one kind within a step."""

    phase: str
    """rollout, likelihood or train."""
    what: str
    """Short label, e.g. "sampler step (window)", "π_old one-step"."""
    model: str
    """Which model runs it: master, rollout (the FP8/FP4 copy, or the master for bf16 rollouts) or reference."""
    calls: int
    """Model calls of this kind per step."""
    rows: int
    """Sequences per call."""
    tokens: int
    """Query tokens fed per row (the canvas, or a cache window)."""
    keys: int
    """Key positions each query attends to (the whole canvas)."""
    head: int
    """Positions per row that go through the LM head."""
    grad: bool = False
    """Forward with autograd (the update); its backward runs too."""
    recompute: bool = False
    """With grad: the call is activation-checkpointed, so backward runs its forward once more."""

    @property
    def row_passes(self) -> int:
        """Rows through the model over the step (calls × rows)."""
        return self.calls * self.rows


def nfe(w: Workload) -> int:
    """Sampler forwards per rollout (Rollout.nfe): the fixed schedule's steps (with a threshold: an upper bound)."""
    return w.sampler_steps


def rollout_passes(w: Workload) -> list[Pass]:
    """The sampler's forwards (samplers/diffusion.py): full canvases, or a block's refresh + its cached windows; a
    family with its own sampler counts its own (Family.plan_rollout_passes: SDAR's cached block steps)."""
    family = get_family(w.family)
    if family.plan_rollout_passes is not None:
        return family.plan_rollout_passes(w)
    T, B, Lb = w.rollout_canvas, w.rows, w.block_length
    blocks = w.gen_length // Lb
    per_block = w.sampler_steps // blocks
    extra = [Pass("rollout", "sampler step, unconditional (CFG)", "rollout", nfe(w), B, T, T, Lb)] if w.cfg else []
    if w.cache == "none":
        return [Pass("rollout", "sampler step (full canvas)", "rollout", nfe(w), B, T, T, Lb), *extra]
    out = [Pass("rollout", "block refresh (full canvas)", "rollout", blocks, B, T, T, Lb)]
    if per_block > 1:
        if w.cache == "dual":
            out.append(Pass("rollout", "cached step (block window)", "rollout", blocks * (per_block - 1), B, Lb, T, Lb))
        else:  # prefix: the window runs from the block start to the end of the canvas; one Pass per block
            for b in range(blocks):
                window = T - (w.rollout_prompt_len + b * Lb)
                out.append(Pass("rollout", "cached step (block to end)", "rollout", per_block - 1, B, window, T, Lb))
    return out


def _committed_per_step(w: Workload) -> int:
    """Completion positions one replayed step scores (the head of a trajectory call)."""
    per_block = w.sampler_steps // (w.gen_length // w.block_length)
    return w.block_length if w.threshold is not None else math.ceil(w.block_length / per_block)


def policy_calls(w: Workload, rows: int) -> list[tuple[int, int]]:
    """(calls, rows per call) of one evaluation of the policy likelihood over `rows` sequences (module docstring)."""
    if w.policy == "one_step":
        return [(1, rows)]
    if w.policy == "trajectory":  # (sequence, step) canvases in chunks of the batch's rows
        return [(w.policy_draws, rows)]
    full, rest = divmod(rows, DRAW_ROWS_PER_CALL)  # per draw: 64-row chunks, then the remainder
    return [(n, r) for n, r in ((w.policy_draws * full, DRAW_ROWS_PER_CALL), (w.policy_draws, rest)) if n and r]


def _policy_passes(w: Workload, what: str, model: str, evaluations: int, rows: int, grad: bool = False) -> list[Pass]:
    name = {"one_step": "one-step"}.get(w.policy, w.policy)
    head = _committed_per_step(w) if w.policy == "trajectory" else w.gen_length
    return [Pass("likelihood" if not grad else "train", f"{what} ({name})", model, evaluations * calls, n, w.canvas,
                 w.canvas, head, grad=grad, recompute=grad and w.policy_checkpointed)
            for calls, n in policy_calls(w, rows)]


def likelihood_passes(w: Workload) -> list[Pass]:
    """π_old, log μ on the same masks, the mismatch ℓ and the reference: no-grad forwards (train/trainer.py)."""
    T, B, L = w.canvas, w.rows, w.gen_length
    it = 1 if w.policy == "trajectory" else w.num_iterations  # one replay serves every iteration
    quantised = w.rollout_precision != "bf16"
    out = _policy_passes(w, "π_old", "rollout" if w.bypass else "master", it, B)
    records = get_family(w.family).records_logp_mu
    recorded = records and w.policy == "trajectory" and w.trajectory_merge == 1  # the sampler's log μ of these canvases
    if quantised and not w.bypass and not recorded:
        out += _policy_passes(w, "log μ (same masks)", "rollout", 1, B)
    if w.mismatch == "elbo":
        rows = B * w.mismatch_draws
        calls = math.ceil(rows / ELBO_ROWS_PER_CALL)
        per_call = min(rows, ELBO_ROWS_PER_CALL)
        for model, who in (("master", "π_old"), ("rollout", "μ")):  # same draws; head: the masked positions (≤ L)
            out.append(Pass("likelihood", f"mismatch ELBO of {who} ({w.mismatch_draws} draws)", model, calls, per_call,
                            T, T, L))
    elif w.mismatch == "trajectory" and not (w.policy == "trajectory" and (records or w.trajectory_merge == 1)):
        # a recorded log μ: only π_old replays (with a trajectory policy ℓ reuses the policy's π_old replay:
        # train/step_mismatch.py); without one (SDAR) both copies replay the path that ran, unless the policy's
        # own replays of π_old and μ are the path law (shrink 1: SDARBackend.policy_replay_is_ratio)
        replayed = w.replay_steps if w.replay_steps is not None else (
            w.trajectory_steps if w.trajectory_steps is not None else nfe(w))
        for model, who in (("master", "π_old"),) if records else (("master", "π_old"), ("rollout", "μ")):
            out.append(Pass("likelihood", "mismatch trajectory replay" if records else f"mismatch replay of {who}",
                            model, replayed, B, T, T, _committed_per_step(w)))
    if w.beta > 0:
        out += _policy_passes(w, "reference (β > 0)", "reference", it, B)
    return out


def train_passes(w: Workload) -> list[Pass]:
    """The updates: forward + backward of the policy likelihood per micro-batch (the last may be smaller)."""
    sizes = [len(range(i, w.rows, w.micro_batches)) for i in range(w.micro_batches)]  # tensor_split's chunk sizes
    out = []
    for size in sorted(set(s for s in sizes if s)):
        out += _policy_passes(w, "forward + backward", "master", w.num_iterations * sizes.count(size), size,
                              grad=True)
    return out


def step_passes(w: Workload) -> list[Pass]:
    """Every model forward of one RL step, in the order the trainer runs them."""
    return [*rollout_passes(w), *likelihood_passes(w), *train_passes(w)]


ASSUMED_PROMPT_LEN = 256
"""Prompt tokens assumed for a hub-model preset when --prompt-len is not given: a GSM8K / MATH question inside
LLaDA's chat template is ~100–250 tokens (no tokenizer is loaded: nothing is downloaded)."""


def measured_prompt_len(preset, rows: int = 64) -> int:
    """Prompt tokens of the built-in tiny model's task: the widest of the task's first `rows` training prompts, encoded
    with the tiny tokenizer as the trainer encodes them (chat template, left padding)."""
    from dllm_ais.models.load import encode_prompts
    from dllm_ais.models.tiny import tiny_tokenizer
    from dllm_ais.tasks.registry import get_task
    from dllm_ais.train.job import task_config_kwargs

    tc = preset.train
    task = get_task(tc.task)
    data = task.load("train", data_path=tc.data_path, seed=tc.seed, **task_config_kwargs(task.load, tc.task_config))
    ids, _ = encode_prompts(tiny_tokenizer(), [r["prompt"] for r in data[:rows]], chat=task.use_chat_template)
    return int(ids.shape[1])


def mismatch_kind(preset) -> str:
    """Which passes compute ℓ (train/trainer.py `_correction`): none, elbo, trajectory or onestep."""
    cc, sc = preset.correction, preset.sampler
    if cc.bypass:
        return "none"
    if preset.train.mismatch_estimator == "trajectory":  # bf16 without a cache: μ = π_old on every canvas
        return "none" if preset.train.rollout_precision == "bf16" and sc.cache == "none" else "trajectory"
    if preset.train.rollout_precision == "bf16":
        return "none"
    return "elbo" if cc.correction_level == "sequence" else "onestep"


def workload_from_preset(preset, *, prompt_len: int | None = None, gpus: int = 1, fsdp: bool | None = None,
                         gradient_checkpointing: bool = False, device: str = "cuda") -> Workload:
    """The Workload of `preset` on `gpus` processes. prompt_len None: measured for the tiny model, else
    ASSUMED_PROMPT_LEN. fsdp None: FSDP2 for full fine-tuning on several GPUs (docs/gpus.md), else DDP.
    device "cuda": the sampler compiles or replays CUDA graphs and pads prompts to PROMPT_BUCKET; "cpu": as the CPU
    runs it."""
    tc, sc, gc = preset.train, preset.sampler, preset.grpo
    if gpus < 1:
        raise ValueError(f"--gpus {gpus}: must be >= 1.")
    if prompt_len is None:
        prompt_len = measured_prompt_len(preset) if preset.model.path is None else ASSUMED_PROMPT_LEN
    if prompt_len < 1:
        raise ValueError(f"--prompt-len {prompt_len}: must be >= 1.")
    fsdp = (gpus > 1 and tc.lora_r == 0) if fsdp is None else fsdp
    if fsdp and gpus < 2:
        raise ValueError("--fsdp shards over several GPUs: pass --gpus N with N >= 2.")
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}[preset.model.dtype]
    # FSDP full fine-tuning: fp32 shards (16-bit ones are refused), bf16 compute through mixed precision
    param_bytes = 4 if (fsdp and tc.lora_r == 0) else dtype_bytes
    act_bytes = 2 if fsdp else dtype_bytes
    # compiled or graphed sampling pads prompts to PROMPT_BUCKET; a family without graphed steps (Dream) runs eager
    graphed = get_family(preset.model.family).graphed_sampling
    compiled = device == "cuda" and (sc.compile or sc.cuda_graphs != "off") and graphed
    policy, merge = tc.policy_logprob, tc.trajectory_merge
    family = get_family(preset.model.family)
    committing = family.plan_commit_steps(sc) if family.plan_commit_steps is not None else sc.steps
    replayed = min(tc.trajectory_steps, committing) if tc.trajectory_steps is not None else committing
    cost = family.replay_step_canvases  # canvases one likelihood forward costs (SDAR: a two-stream forward, 2)
    if policy == "trajectory":
        draws = -(-replayed // merge) * cost
    elif policy == "one_step":
        draws = 1
    elif policy in family.own_policy_logprobs:  # a family's own likelihood (SDAR's ebpo): the family counts it
        draws = family.plan_policy_rows(tc, sc) * cost
    else:  # a mask-draw likelihood: its registry object knows its rows (mdpo, dtreerpo: capped by the steps)
        from dllm_ais.likelihood.policy import policy_likelihood

        draws = policy_likelihood(policy, tc.likelihood, sc.block_length, sc.steps).rows_per_sequence * cost
    rollout_prompt = -(-prompt_len // PROMPT_BUCKET) * PROMPT_BUCKET if compiled else prompt_len
    return Workload(
        rows=tc.prompts_per_step * gc.num_generations, prompt_len=prompt_len, rollout_prompt_len=rollout_prompt,
        gen_length=sc.gen_length, block_length=sc.block_length, sampler_steps=sc.steps, cache=sc.cache,
        threshold=sc.threshold, cfg=sc.cfg_scale > 0, temperature=sc.temperature, remasking=sc.remasking,
        rollout_precision=tc.rollout_precision, param_bytes=param_bytes, act_bytes=act_bytes, lora_r=tc.lora_r,
        micro_batches=min(tc.gradient_accumulation_steps, tc.prompts_per_step * gc.num_generations),
        num_iterations=gc.num_iterations, beta=gc.beta, mismatch=mismatch_kind(preset),
        mismatch_draws=tc.mismatch_num_draws, trajectory_steps=tc.trajectory_steps, bypass=preset.correction.bypass,
        gpus=gpus, fsdp=fsdp, gradient_checkpointing=gradient_checkpointing, train_steps=tc.steps, policy=policy,
        policy_draws=draws, trajectory_merge=merge, family=preset.model.family, replay_steps=replayed * cost)
