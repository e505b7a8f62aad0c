"""AIS-GRPO training loop: rollout → reward → advantages → mismatch → correction → loss → step → FP8 sync.

Orchestration only: every formula lives in a pure function elsewhere (advantages, correction, grpo, likelihood).
Every random draw comes from a generator seeded by (seed, step, purpose), so a resumed run reproduces the
uninterrupted one. Distributed runs come from `accelerate launch` (DDP/FSDP from accelerate's config).
"""

from __future__ import annotations

import copy
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm_ais import metrics as M
from dllm_ais.advantages import group_advantages
from dllm_ais.backend import Backend
from dllm_ais.config import Preset
from dllm_ais.correction import correct
from dllm_ais.grpo import grpo_loss
from dllm_ais.models.load import encode_prompts
from dllm_ais.run_dir import RunDir

TOKEN_MEAN_LOSSES = ("bnpo", "dapo")
"""GRPO loss types normalised by the number of counted tokens (micro-batches are weighted by their token share)."""


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A seed for one purpose at one step, independent of everything that ran before."""
    return zlib.crc32(f"{seed}/{step}/{purpose}".encode())


def step_generator(seed: int, step: int, purpose: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with `step_seed(seed, step, purpose)`."""
    return torch.Generator(device=device).manual_seed(step_seed(seed, step, purpose))


@dataclass
class Policy:
    """The models of one run and how to save them."""

    model: torch.nn.Module
    """BF16 master being trained (possibly peft-wrapped; possibly wrapped by accelerate)."""
    tokenizer: object
    """Tokenizer (left padding)."""
    backend: Backend
    """Sampling / likelihood interface."""
    save_model: object
    """save_model(unwrapped_model, directory) writes the model (or adapter) in its checkpoint layout."""
    load_model_state: object
    """load_model_state(unwrapped_model, directory) restores what save_model wrote."""
    use_chat_template: bool = True
    """Wrap prompts in the tokenizer's chat template."""


class StepSkipped(Exception):
    """A step that could not be used (reward error); reported and counted, training goes on."""


def _batch_rows(rows: list[dict], step: int, per_step: int, rank: int, world: int, seed: int) -> list[dict]:
    """Prompts of `step` for process `rank`: a fresh seeded permutation per epoch, consumed in order."""
    n = len(rows)
    start = (step * world + rank) * per_step
    perms: dict[int, list[int]] = {}  # one permutation per epoch the step touches (at most two)
    out = []
    for i in range(start, start + per_step):
        epoch, j = divmod(i, n)
        if epoch not in perms:
            perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        out.append(rows[perms[epoch][j]])
    return out


def compute_rewards(reward_fn, prompts: list[str], completions: list[str], rows: list[dict]) -> torch.Tensor:
    """Call a TRL-style reward function; any exception becomes StepSkipped naming the function."""
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    try:
        values = reward_fn(prompts, completions, **columns)
        out = torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)
    except Exception as e:  # user code: report, never crash the run
        name = getattr(reward_fn, "__qualname__", repr(reward_fn))
        raise StepSkipped(f"reward function {name} raised {type(e).__name__}: {e}") from e
    if out.shape != (len(completions),):
        raise StepSkipped(f"reward function returned {out.numel()} values for {len(completions)} completions.")
    if not torch.isfinite(out).all():
        raise StepSkipped("reward function returned None/NaN/inf for some completions.")
    return out


class Trainer:
    """Runs the loop for one Preset in one run directory."""

    def __init__(self, preset: Preset, policy: Policy, run: RunDir, reward_fn, rows: list[dict],
                 accelerator=None, progress: bool = True):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        self.cfg = preset
        self.tc = preset.train
        self.policy = policy
        self.run = run
        self.reward_fn = reward_fn
        self.rows = rows
        self.progress = progress
        self.acc = accelerator or Accelerator(cpu=preset.model.device == "cpu")
        if self.acc.distributed_type == DistributedType.FSDP and self.tc.rollout_precision == "fp8":
            raise ValueError("FP8 rollouts under FSDP are not supported yet (the FP8 copy needs the full, unsharded "
                             "weights); use DDP (distributed_type: MULTI_GPU) with LoRA, or --rollout-precision bf16.")
        model = policy.model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.tc.learning_rate, weight_decay=self.tc.weight_decay)
        warm = self.tc.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0)
        # The scheduler stays unprepared: accelerate would step it once per process per update.
        self.model, self.optimizer = self.acc.prepare(model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.ref_model = None
        if preset.grpo.beta > 0 and not self._is_peft():
            self.ref_model = copy.deepcopy(self.master).eval().requires_grad_(False)
        self.rollout_model = self._make_rollout_model()
        self.step = 0
        self.prev_lam = None
        self.skipped = 0
        self.reward_errors = 0
        self._updated_this_step = False  # an update of the current step happened: the state is mid-step
        self._stop_requested = False  # first Ctrl-C: finish the step, checkpoint, stop

    # ---------------------------------------------------------------------------------------------------- models
    @property
    def master(self):
        return self.acc.unwrap_model(self.model)

    def _is_peft(self) -> bool:
        return hasattr(self.master, "disable_adapter")

    def _make_rollout_model(self):
        if self.tc.rollout_precision == "bf16":
            return self.master
        from dllm_ais.fp8.linear import quantize_model
        from dllm_ais.models import qwen_rollout

        if qwen_rollout.supports(self.master):  # Qwen3: fused static-cache rollout copy (models/qwen_rollout.py)
            return qwen_rollout.rollout_copy(self.master, fp8_backend=self.tc.fp8_backend)
        return quantize_model(self.master, backend=self.tc.fp8_backend)

    def _sync_rollout(self) -> None:
        if self.rollout_model is not self.master:
            from dllm_ais.fp8.linear import sync_weights
            from dllm_ais.models.qwen_rollout import QwenRollout, sync_qwen_rollout

            sync = sync_qwen_rollout if isinstance(self.rollout_model, QwenRollout) else sync_weights
            sync(self.master, self.rollout_model)

    def _ref_logp(self, rollout, seed):
        if self.ref_model is not None:
            return self.policy.backend.token_logp(self.ref_model, rollout, seed)
        with self.master.disable_adapter():
            return self.policy.backend.token_logp(self.master, rollout, seed)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def save(self) -> Path | None:
        if not self.acc.is_main_process:
            return None
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "prev_lam": None if self.prev_lam is None else float(self.prev_lam), "skipped": self.skipped,
                 "reward_errors": self.reward_errors}
        return self.run.save_checkpoint(self.step, lambda d: self.policy.save_model(self.master, d), state)

    def resume(self) -> None:
        ckpt = self.run.latest()
        if ckpt is None:  # interrupted before its first checkpoint: start over
            if self.acc.is_main_process:
                M.MetricsWriter(self.run.path).truncate_after(-1)
            return
        RunDir.verify(ckpt)
        self.policy.load_model_state(self.master, ckpt)
        state = RunDir.load_state(ckpt)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.prev_lam = None if state["prev_lam"] is None else torch.tensor(state["prev_lam"])
        self.skipped, self.reward_errors = state["skipped"], state["reward_errors"]
        self._sync_rollout()
        if self.acc.is_main_process:
            M.MetricsWriter(self.run.path).truncate_after(self.step - 1)

    # ------------------------------------------------------------------------------------------------------ step
    def train_step(self) -> dict[str, float]:
        """One GRPO step; returns its metrics row."""
        cfg, tc, backend, step = self.cfg, self.tc, self.policy.backend, self.step
        G, device = cfg.grpo.num_generations, self.acc.device
        row: dict[str, float] = {M.STEP: step}
        t0 = time.perf_counter()

        rows = _batch_rows(self.rows, step, tc.prompts_per_step, self.acc.process_index, self.acc.num_processes,
                           tc.seed)
        rows = [r for r in rows for _ in range(G)]  # each prompt's G generations contiguous
        prompts = [r["prompt"] for r in rows]
        ids, mask = encode_prompts(self.policy.tokenizer, prompts, chat=self.policy.use_chat_template, device=device)
        self.master.eval()
        rollout = backend.sample(self.rollout_model, ids, mask, step_generator(tc.seed, step, "sample", device))
        t_roll = time.perf_counter() - t0
        n_tokens = int(rollout.completion_mask.sum())
        row.update({M.ROLLOUT_TOKENS_PER_S: rollout.completion_ids.numel() / max(t_roll, 1e-9),
                    M.ROLLOUT_STEPS: rollout.num_steps, M.ROLLOUT_GEN_LEN: n_tokens / len(rows),
                    M.time_key("rollout"): t_roll})

        tok = self.policy.tokenizer
        texts = [tok.decode(c[k], skip_special_tokens=True)
                 for c, k in zip(rollout.completion_ids, rollout.completion_mask, strict=True)]
        try:
            rewards, error = compute_rewards(self.reward_fn, prompts, texts, rows).to(device), None
        except StepSkipped as e:
            rewards, error = None, e
        if self._any_process(error is not None):  # skip together, or the others would wait in the all-reduce
            raise error or StepSkipped("another process's reward function failed")
        row[M.REWARD_MEAN] = float(rewards.mean())
        row[M.reward_key(tc.task)] = row[M.REWARD_MEAN]
        adv_out = group_advantages(rewards, G, cfg.grpo.scale_rewards)
        adv = adv_out.adv
        row.update(adv_out.metrics())

        t1 = time.perf_counter()
        level = cfg.correction.correction_level
        with torch.no_grad():
            log_w = backend.mismatch_log_w(self.master, self.rollout_model, rollout,
                                           step_generator(tc.seed, step, "mismatch", device), level)
        corr = correct(log_w, adv, rollout.completion_mask, cfg.correction, prev_lam=self.prev_lam)
        row.update(corr.metrics())
        row[M.time_key("mismatch")] = time.perf_counter() - t1

        t2 = time.perf_counter()
        seeds = [step_seed(tc.seed, step, f"logp/{it}") for it in range(cfg.grpo.num_iterations)]
        with torch.no_grad():
            logp_old = [backend.token_logp(self.master, rollout, s) for s in seeds]
            logp_ref = [self._ref_logp(rollout, s) for s in seeds] if cfg.grpo.beta > 0 else None
        losses = []
        for it, seed in enumerate(seeds):
            out = self._update(rollout, adv, corr.omega, logp_old[it], None if logp_ref is None else logp_ref[it],
                               seed)
            if out is not None:
                losses.append(out)
        row[M.time_key("update")] = time.perf_counter() - t2
        for key in (M.LOSS_POLICY, M.LOSS_CLIP, "loss/kl"):
            vals = [m[key] for m in losses if key in m]
            row[key] = sum(vals) / len(vals) if vals else float("nan")
        if cfg.grpo.beta == 0:
            row.pop("loss/kl")
        if torch.isfinite(corr.lam):  # a NaN λ must not poison the EMA of every later step
            self.prev_lam = corr.lam
        t3 = time.perf_counter()
        self._sync_rollout()
        row[M.time_key("sync")] = time.perf_counter() - t3
        row[M.time_key("step")] = time.perf_counter() - t0
        return row

    def _update(self, rollout, adv, omega, logp_old, logp_ref, seed) -> dict[str, float] | None:
        """One optimizer update over the batch (micro-batched); None if the loss was not finite (skipped)."""
        cfg, backend = self.cfg, self.policy.backend
        self.model.train()
        B = adv.shape[0]
        chunks = torch.arange(B, device=adv.device).tensor_split(self.tc.gradient_accumulation_steps)
        mask = rollout.completion_mask
        token_mean = cfg.grpo.loss_type in TOKEN_MEAN_LOSSES
        metrics: list[dict[str, float]] = []
        finite = True
        for idx in chunks:
            if idx.numel() == 0:
                continue
            logp = backend.token_logp(self.model, rollout, seed, rows=idx)
            out = grpo_loss(logp, logp_old[idx], adv[idx], mask[idx], cfg.grpo,
                            weights=omega[idx], logp_ref=None if logp_ref is None else logp_ref[idx])
            # Each chunk's loss is a mean over its sequences (grpo, dr_grpo) or its tokens (bnpo, dapo); weight it by
            # its share of the batch's sequences or tokens, so the sum equals the full-batch loss.
            share = (mask[idx].sum() / mask.sum().clamp(min=1)) if token_mean else idx.numel() / B
            loss = out.loss * share
            if self._any_process(not torch.isfinite(loss)):  # a collective decision: DDP all-reduces in backward
                finite = False
                break
            self.acc.backward(loss)
            metrics.append(out.metrics())
        grads_ok = finite and not self._any_process(not all(p.grad is None or torch.isfinite(p.grad).all()
                                                            for p in self.model.parameters() if p.requires_grad))
        if not grads_ok:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            return None
        if self.tc.max_grad_norm > 0:
            self.acc.clip_grad_norm_(self.model.parameters(), self.tc.max_grad_norm)
        self.optimizer.step()
        self._updated_this_step = True
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {k: sum(m[k] for m in metrics) / len(metrics) for k in metrics[0]}

    # ------------------------------------------------------------------------------------------------------ loop
    def fit(self) -> list[dict[str, float]]:
        """Run to `train.steps`. Returns the rows written by this call.

        The first Ctrl-C lets the current step finish, writes a checkpoint and raises KeyboardInterrupt; a second one
        (or any KeyboardInterrupt mid-step) stops at once, writing a checkpoint only if no update of the step has
        happened yet — a checkpoint is always a step boundary, so --resume reproduces the uninterrupted run.
        """
        writer = M.MetricsWriter(self.run.path, tensorboard=self.tc.tensorboard) if self.acc.is_main_process else None
        bar = None
        if self.progress and self.acc.is_main_process:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.tc.steps, initial=self.step, desc="AIS-GRPO", unit="step")
        written = []
        restore = self._install_sigint()
        try:
            while self.step < self.tc.steps:
                self._updated_this_step = False
                try:
                    row = self.train_step()
                except StepSkipped as e:
                    self.reward_errors += 1
                    self.skipped += 1
                    print(f"step {self.step}: skipped — {e}", file=sys.stderr)
                    row = {M.STEP: self.step, M.REWARD_ERRORS: 1.0}
                row[M.SKIPPED_STEPS] = self.skipped
                row.setdefault(M.REWARD_ERRORS, 0.0)
                row = self._reduce(row)
                for key in M.REQUIRED_STEP_METRICS:
                    row.setdefault(key, float("nan"))
                if writer is not None:
                    writer.write(row)
                written.append(row)
                self.step += 1
                self._updated_this_step = False
                if bar is not None:
                    bar.set_postfix(reward=f"{row[M.REWARD_MEAN]:.3f}", lam=f"{row[M.AIS_LAMBDA]:.3f}")
                    bar.update(1)
                if self._stop_requested:
                    raise KeyboardInterrupt
                if self.tc.save_every and self.step % self.tc.save_every == 0 and self.step < self.tc.steps:
                    self.save()
        except KeyboardInterrupt:
            if self._updated_this_step:
                latest = self.run.latest()
                print(f"\ninterrupted during an update of step {self.step}: no checkpoint written (it would not be a "
                      f"step boundary); the newest is {latest}", file=sys.stderr)
            else:
                path = self.save()
                print(f"\ninterrupted: checkpoint written to {path}; continue with --resume", file=sys.stderr)
            raise
        finally:
            restore()
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        self.save()
        return written

    def _install_sigint(self):
        """First SIGINT sets a flag (stop after this step); the second raises at once. Returns the restorer."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            if self._stop_requested:
                raise KeyboardInterrupt
            self._stop_requested = True
            print("\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to stop now)",
                  file=sys.stderr)

        signal.signal(signal.SIGINT, handler)
        return lambda: signal.signal(signal.SIGINT, previous)

    def _any_process(self, flag: bool) -> bool:
        """True if `flag` holds on any process (the same answer everywhere)."""
        if self.acc.num_processes == 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.acc.device)
        return bool(self.acc.reduce(t, reduction="sum").item() > 0)

    def _reduce(self, row: dict[str, float]) -> dict[str, float]:
        """Average every metric over processes (identical on one process)."""
        if self.acc.num_processes == 1:
            return row
        keys = sorted(row)
        vals = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64, device=self.acc.device)
        vals = self.acc.reduce(vals, reduction="mean")
        out = dict(zip(keys, vals.tolist(), strict=True))
        out[M.STEP] = row[M.STEP]
        return out
