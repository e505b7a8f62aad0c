"""Peak memory per GPU of one RL step, by part: pure arithmetic on a ModelShape and a Workload.

The activation terms are the tensors the code keeps alive, counted per token from the code itself (docs/plan.md lists
them op by op): s = bytes of the master's compute dtype, d / h / H = width, MLP width, heads.

- Saved for backward, one LLaDABlock (models/llada/model.py; RMSNorm computes in fp32), per canvas token:
    full fine-tuning  16d + 6sd + 4sh + 4H + 8 + s
    LoRA (fp32 adapters on the 7 block linears, base frozen)  8d + 8 + 4sd + 4H + s + c + 3sh + 4h + 28r,
                      c = 8d in fp32 (the adapters read the block's own tensors), 24d otherwise (each adapter casts
                      its input to fp32: q, k, v, attn_out, ff_proj, up_proj)
- Training temporaries on top, per token: forward's last (LoRA: a widest adapter's fp32 update and its scaled copy,
  8h; full fine-tuning 2sd) or backward's (a block's activation gradients, sh + 2sd), whichever is larger.
- No-grad forward working set of the master (the largest moment of a block: the MLP product while the attention's
  q, k, v and output are still local variables, or the second RoPE), per token:
    max(7sd + 3sh, 6sd + 16d (fp32) | 20d (16-bit)) + 8·head_dim (the fp32 RoPE tables)
  and of the fused FP8 rollout copy on a GPU (Triton producers; GEMM outputs in s), per token:
    10sd + 2sh + h (FP8 codes) + 4·head_dim (half-width RoPE tables) + 4H
- The sampler's tail per logit element (B × block × V): `sampling_tail_bytes` (52 bytes at T > 0 with
  low-confidence remasking: fp32 logits, fp64 softmax, fp64 logits, uniforms, Gumbel noise, their sum).

Peak = the parts that live through the step (master, LoRA, optimizer states, reference, rollout copy) + the largest
of the three phases: rollout (KV cache + sampler activations), likelihood (no-grad passes), train (gradients +
one micro-batch's activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_ais.families import get_family

from .shape import LORA_TARGETS_PER_BLOCK, ModelShape
from .workload import Pass, Workload, likelihood_passes, rollout_passes

GiB = 2**30
LOGPROB_CHUNK_ELEMENTS = 2**25
"""likelihood/logprobs.py MAX_CHUNK_ELEMENTS: the fp32 log-softmax works on at most this many logits at a time."""


@dataclass(frozen=True)
class MemoryPlan:
    """Predicted bytes per GPU, by part and by phase."""

    master: float
    """Master weights as stored (FSDP: this GPU's shard)."""
    fp32_master_copy: float
    """fp32 copies of 16-bit trained parameters (train/master_weights.py: full fine-tuning without FSDP)."""
    lora: float
    """LoRA adapters (fp32)."""
    optimizer: float
    """AdamW exp_avg and exp_avg_sq (fp32) of every trained parameter (FSDP: sharded)."""
    gradients: float
    """Gradients while an update runs (16-bit full fine-tuning adds their fp32 copies; DDP its buckets)."""
    reference: float
    """Frozen KL reference copy (β > 0 and full fine-tuning; with LoRA the reference is the adapter-free base)."""
    rollout_copy: float
    """The FP8 / FP4 rollout copy (0 for bf16 rollouts); FSDP keeps it whole on every GPU."""
    kv_cache: float
    """Fast-dLLM K/V buffers [layers, B, H_kv, canvas, head_dim] × 2, while rolling out."""
    rollout_activations: float
    """Sampler: the largest forward working set or the float64 sampling tail, whichever is larger."""
    likelihood_activations: float
    """The largest no-grad likelihood pass (π_old, log μ, ELBO, replay, reference)."""
    train_activations: float
    """One training micro-batch: what forward saves for backward plus backward's own peak, without checkpointing."""
    train_activations_checkpointed: float
    """The same micro-batch with every block checkpointed (block inputs saved, one block recomputed at a time)."""
    fsdp_gathered: float
    """FSDP: whole bf16 parameters of the blocks being computed (two, with prefetch), during forwards."""
    gradient_checkpointing: bool
    """Whether the train phase below uses the checkpointed figure."""

    @property
    def fixed(self) -> float:
        """Bytes alive through the whole step."""
        return self.master + self.fp32_master_copy + self.lora + self.optimizer + self.reference + self.rollout_copy

    @property
    def phases(self) -> dict[str, float]:
        """Peak of each phase (fixed parts included)."""
        train = self.train_activations_checkpointed if self.gradient_checkpointing else self.train_activations
        return {"rollout": self.fixed + self.kv_cache + self.rollout_activations,
                "likelihood": self.fixed + self.fsdp_gathered + self.likelihood_activations,
                "train": self.fixed + self.fsdp_gathered + self.gradients + train}

    @property
    def peak(self) -> float:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)


def layer_saved_bytes(shape: ModelShape, s: int, lora_r: int, first: bool = False) -> float:
    """Bytes per token one LLaDABlock saves for backward (module docstring). first: the block after the embedding,
    whose input needs no gradient under LoRA (the embedding is frozen), so its first RMSNorm saves nothing."""
    d, h, H = shape.d_model, shape.mlp_hidden, shape.n_heads
    attention = 4 * s * d + 4 * H + s  # q, k (after RoPE), v, output; log-sum-exp (fp32); the mask in s
    if not lora_r:  # two RMSNorms (fp32 input copy, 1/rms, normalised x for the weight's gradient, the output)
        return 2 * (8 * d + s * d + 4) + attention + 4 * s * h
    norms = (8 * d + 8) - ((4 * d + 4) if first else 0)  # fp32 input and 1/rms; the frozen weight needs no more
    casts = 8 * d if s == 4 else 24 * d
    return norms + attention + casts + 3 * s * h + 4 * h + 4 * LORA_TARGETS_PER_BLOCK * lora_r


def master_working_set(shape: ModelShape, s: int) -> float:
    """Bytes per token of a no-grad master forward at its largest moment (module docstring)."""
    d, h = shape.d_model, shape.mlp_hidden
    return max(7 * s * d + 3 * s * h, 6 * s * d + (16 if s == 4 else 20) * d) + 8 * shape.head_dim


def fused_working_set(shape: ModelShape, s: int) -> float:
    """Bytes per token of a fused FP8 rollout copy's forward on a GPU, at a block's last residual add
    (models/llada/fused_fp8.py `_block_fp8_producers`, Triton producers): the block input, qkv, rotated q and k,
    attention output and its log-sum-exp, the mid residual, gate-up output, the FP8 codes and scales of silu·up, the
    down projection's output and the new residual; the half-width fp32 RoPE tables."""
    d, h = shape.d_model, shape.mlp_hidden
    return 10 * s * d + 2 * s * h + h * (1 + 4 / 128) + 4 * shape.head_dim + 4 * shape.n_heads


def sampling_tail_bytes(temperature: float, remasking: str, s: int, cfg: bool = False) -> int:
    """Bytes per logit element (B × block × V) at the sampler's largest moment (samplers/diffusion.py): the model's
    logits then their fp32 copy; the fp64 softmax for low-confidence remasking; Gumbel-max at T > 0 (fp64 logits,
    uniforms, two chained temporaries, the noise and the perturbed logits); CFG adds the unconditional logits."""
    lc = 8 if remasking == "low_confidence" else 0  # the fp64 probabilities, alive until the commit
    logits = (s + 4) if s != 4 else 4  # the model's logits while `.float()` copies them
    softmax = 4 + 8 + 8 if lc else 0  # fp32 logits, their fp64 copy, the softmax
    propose = 4 + lc + (5 * 8 if temperature > 0 else 8)  # fp64 logits, uniforms, noise, T·noise, sum (or argmax)
    return max(logits, softmax, propose) + (8 if cfg else 0)


def _head_bytes(shape: ModelShape, rows: int, positions: int, s: int) -> float:
    """A no-grad LM head over rows × positions: ln_f (fp32 copy, temporaries, output), the logits in s and the fp32
    log-softmax of one chunk (likelihood/logprobs.py) with its input copy."""
    n = rows * positions
    chunk = min(n, max(1, LOGPROB_CHUNK_ELEMENTS // shape.vocab)) * shape.vocab
    return n * (12 * shape.d_model + s * shape.d_model + s * shape.vocab) + chunk * (4 if s == 4 else 8)


def pass_bytes(shape: ModelShape, p: Pass, s: int, fused: bool) -> float:
    """Peak activation bytes of one no-grad call: the blocks' working set or the head, whichever is larger (the
    residual stream [rows, tokens, d] stays alive through the head)."""
    per_token = fused_working_set(shape, s) if fused else master_working_set(shape, s)
    body = p.rows * p.tokens * per_token
    return max(body, p.rows * p.tokens * s * shape.d_model + _head_bytes(shape, p.rows, p.head, s))


def train_bytes(shape: ModelShape, w: Workload, checkpointed: bool) -> float:
    """One micro-batch of the update (update_rows × canvas tokens, the head over the completion): what forward saves
    for backward, plus the larger of forward's last temporaries (LoRA: a widest adapter's fp32 update and its scaled
    copy, 8h per token; full fine-tuning 2sd) and backward's (the logits' gradient with one fp32 log-softmax chunk,
    or a block's activation gradients, sh + 2sd per token, while its saved tensors are still alive)."""
    s, b, T, L = w.act_bytes, w.update_rows, w.canvas, w.gen_length
    d, h, V = shape.d_model, shape.mlp_hidden, shape.vocab
    n, m = b * T, b * L
    layers = [layer_saved_bytes(shape, s, w.lora_r, first=i == 0) for i in range(shape.n_layers)]
    shared = n * (8 * shape.head_dim + (0 if w.lora_r else 8))  # RoPE tables; token ids (embedding gradient)
    ln_input = 4 * d * (n if s == 4 else m)  # fp32: the last block's output itself; else an fp32 copy of the slice
    head = ln_input + m * (4 if w.lora_r else 4 + 4 * d + s * d) + m * s * V  # + the logits (kept by the chunks)
    chunk = min(m, max(1, LOGPROB_CHUNK_ELEMENTS // V)) * V
    forward_extra = n * (8 * h if w.lora_r else 2 * s * d)
    backward_block = n * (s * h + 2 * s * d)
    backward_head = m * s * V + 3 * 4 * chunk  # d(logits); the recomputed chunk, its log-softmax and gradient
    constants = shape.n_layers * (8 * d if s != 4 else 0)  # the norms' fp32 weight copies
    if checkpointed:  # each block keeps its input; backward recomputes one block at a time
        saved = n * s * d * shape.n_layers + shared + head
        return saved + max(backward_head, forward_extra, n * max(layers) + backward_block) + constants
    saved = n * sum(layers) + shared + head
    return saved + max(forward_extra, backward_head, backward_block) + constants


def predict_memory(shape: ModelShape, w: Workload, rollout_copy_bytes: int, fused_copy: bool = True) -> MemoryPlan:
    """Every part of MemoryPlan for one GPU process. rollout_copy_bytes: shape.rollout_copy_bytes's answer.
    fused_copy: the rollout copy's forward is the fused FP8 model on a GPU (else it is taken as the master's)."""
    P, pb, s = shape.params_total, w.param_bytes, w.act_bytes
    shard = w.gpus if w.fsdp else 1
    lora = shape.lora_params(w.lora_r) if w.lora_r else 0
    trained = lora if w.lora_r else P
    master_copy = 4 * P if (not w.lora_r and pb < 4 and not w.fsdp) else 0
    grad_bytes = 4 if w.lora_r else pb
    gradients = trained * grad_bytes / shard + master_copy  # + fp32 copies of 16-bit gradients at the step
    if w.gpus > 1 and not w.fsdp:
        gradients += trained * grad_bytes  # DDP's flat buckets
    block_params = shape.params_block_linear / shape.n_layers
    rollout_fused = fused_copy and w.rollout_precision == "fp8"
    roll = [pass_bytes(shape, p, s, rollout_fused) for p in rollout_passes(w)]
    tail = w.rows * w.block_length * shape.vocab * sampling_tail_bytes(w.temperature, w.remasking, s, w.cfg)
    likelihood = [pass_bytes(shape, p, s, rollout_fused and p.model == "rollout") for p in likelihood_passes(w)]
    cached = w.cache != "none" or get_family(w.family).native_kv_cache  # Fast-dLLM's cache, or SDAR's own
    kv = 2 * shape.n_layers * w.rows * w.rollout_canvas * shape.kv_dim * s if cached else 0
    return MemoryPlan(
        master=P * pb / shard, fp32_master_copy=master_copy, lora=lora * 4 / shard, optimizer=trained * 8 / shard,
        gradients=gradients,
        reference=(P * pb / shard) if (w.beta > 0 and not w.lora_r) else 0.0,
        rollout_copy=float(rollout_copy_bytes), kv_cache=float(kv),
        rollout_activations=max([tail, *roll]), likelihood_activations=max(likelihood, default=0.0),
        train_activations=train_bytes(shape, w, checkpointed=False),
        train_activations_checkpointed=train_bytes(shape, w, checkpointed=True),
        fsdp_gathered=(2 * block_params * 2) if w.fsdp else 0.0,
        gradient_checkpointing=w.gradient_checkpointing,
    )


def gib(x: float) -> float:
    return x / GiB

