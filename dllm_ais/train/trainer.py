"""AIS-GRPO training loop: rollout → reward → advantages → mismatch → correction → loss → step → FP8 sync.

Orchestration only: every formula lives in a pure function elsewhere (advantages, correction, grpo, likelihood).
Every random draw comes from a generator seeded by (seed, step, purpose), so a resumed run reproduces the
uninterrupted one. Distributed runs come from `accelerate launch` (DDP/FSDP from accelerate's config).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm_ais import metrics as M
from dllm_ais.config import Preset
from dllm_ais.models.load import encode_prompts
from dllm_ais.progress import progress_bar
from dllm_ais.rl.advantages import group_advantages
from dllm_ais.rl.correction import CorrectionOutput, rejected_loss_mask
from dllm_ais.rl.error_tokens import error_keep, repeated_ngram_fraction
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.rl.spg import spg_loss
from dllm_ais.train import fsdp_setup, grad_diagnostics, step_mismatch, trackers, trainer_state
from dllm_ais.train.backend import Backend
from dllm_ais.train.distributed import global_sum
from dllm_ais.train.interrupt import install_sigint, resume_command
from dllm_ais.train.master_weights import MasterWeights
from dllm_ais.train.rewards import RewardSet, StepSkipped, TrainerState, conversational_form
from dllm_ais.train.rollout_policy import make_rollout_model, sync_rollout
from dllm_ais.train.run_dir import RunDir
from dllm_ais.train.step_data import batch_rows, generated_tokens, micro_batches, step_generator, step_seed

TOKEN_MEAN_LOSSES = ("bnpo", "dapo")
"""GRPO loss types normalised by the number of counted tokens of the global batch, as TRL does (every micro-batch
of every process is weighted by its share of the tokens of all processes)."""


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
        self.reward_fn = reward_fn if isinstance(reward_fn, RewardSet) else RewardSet([reward_fn])
        self.rows = rows
        self.progress = progress
        self.acc = accelerator or Accelerator(cpu=preset.model.device == "cpu",
                                              **trackers.accelerator_kwargs(preset.train.report_to, run.path))
        self.fsdp = self.acc.distributed_type == DistributedType.FSDP
        if self.fsdp:  # run_training refused these from the launch's environment; a Trainer built directly too
            reason = fsdp_setup.fsdp_refusals(preset, 2 if getattr(self.acc, "is_fsdp2", False) else 1)
            if reason is not None:
                raise ValueError(reason)
        model = policy.model
        if self.fsdp:  # each process shards its own full model: they must be equal (DDP broadcasts in prepare)
            fsdp_setup.broadcast_from_main(model)
        params = [p for p in model.parameters() if p.requires_grad]
        # 16-bit parameters (bf16 full fine-tuning) get fp32 master copies: AdamW updates those, the model computes in
        # bf16. Under FSDP the sharded parameters are the master: load fp32 and let FSDP's mixed precision cast.
        self.master_weights = MasterWeights(params) if MasterWeights.needed(params) else None
        if self.master_weights is not None and self.fsdp:
            raise ValueError("FSDP with 16-bit parameters would update them in 16 bits (small updates are lost); load "
                             "the model in float32 (ModelConfig.dtype / --dtype float32) and set accelerate's "
                             "mixed_precision: bf16, so that FSDP keeps fp32 sharded master weights.")
        opt_params = params if self.master_weights is None else self.master_weights.master
        self.optimizer = torch.optim.AdamW(opt_params, lr=self.tc.learning_rate, weight_decay=self.tc.weight_decay)
        warm = self.tc.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0)
        # Under FSDP the FP8 copy is made from the full weights before they are sharded (afterwards only sync).
        rollout_first = self.fsdp and self.tc.rollout_precision != "bf16"
        if rollout_first:
            self.model = model
            self.rollout_model = self._make_rollout_model()
        needs_ref = preset.grpo.beta > 0 and not hasattr(model, "disable_adapter")  # LoRA: the adapter-free base
        fsdp2 = self.fsdp and getattr(self.acc, "is_fsdp2", False)
        ref = fsdp_setup.reference_copy(model) if needs_ref and fsdp2 else None  # FSDP2 modules refuse deepcopy
        # The scheduler stays unprepared: accelerate would step it once per process per update.
        self.model, self.optimizer = self.acc.prepare(model, self.optimizer)
        if self.master_weights is not None:  # DDP broadcast rank 0's parameters in prepare: the masters follow
            self.master_weights.model_to_master()
        self._zero_grad()
        self.ref_model = None
        if needs_ref:
            self.ref_model = fsdp_setup.shard_reference(self.acc, ref) if fsdp2 else \
                copy.deepcopy(self.master).eval().requires_grad_(False)
        # (--train-forward aligned without FP8 rollouts is refused by Preset, before anything is created)
        if not rollout_first:
            self.rollout_model = self._make_rollout_model()
        self.step = 0
        self.prev_lam = None
        self.skipped = 0
        self.reward_errors = 0
        self._updated_this_step = False  # an update of the current step happened: the state is mid-step
        self._stop_reason = None  # first Ctrl-C / SIGTERM / SIGUSR1: finish the step, checkpoint, stop

    # ---------------------------------------------------------------------------------------------------- models
    @property
    def master(self):
        return self.acc.unwrap_model(self.model)

    def _is_peft(self) -> bool:
        return hasattr(self.master, "disable_adapter")

    def _make_rollout_model(self):
        rollout = make_rollout_model(self.master, self.cfg)
        if self.tc.rollout_precision == "fp8":
            self._record_fp8_backends(rollout)
        return rollout

    def _record_fp8_backends(self, rollout) -> None:
        """Keep (self.fp8_backends) and write to <run>/fp8_backends.json the FP8 backend each layer shape runs (`auto`
        resolved at build time), for the record."""
        import json

        from dllm_ais.atomic import atomic_write_text
        from dllm_ais.fp8.linear import backend_choices

        self.fp8_backends = choices = backend_choices(rollout)
        if choices and self.acc.is_main_process and self.run.path.is_dir():
            atomic_write_text(self.run.path / "fp8_backends.json", json.dumps(choices, indent=2, sort_keys=True))

    def _sync_rollout(self) -> None:
        sync_rollout(self.master, self.rollout_model, self.fsdp)

    def _train_forward(self):
        """Context of every π_θ / π_old forward of the master: plain, or QaRL's aligned fake-quant forward."""
        return step_mismatch.train_forward(self)

    def _micro_batches(self, B: int, device) -> list[torch.Tensor]:
        """The row chunks of one update (gradient accumulation)."""
        return micro_batches(B, self.tc.gradient_accumulation_steps, device)

    # π_old, the correction and the reference (train/step_mismatch.py); methods, so tests and benchmarks can wrap them
    def _old_logp(self, rollout, seeds: list[int]) -> list[torch.Tensor]:
        return step_mismatch.old_logp(self, rollout, seeds)

    def _correction(self, rollout, adv, logp_old: torch.Tensor, seed: int
                    ) -> tuple[CorrectionOutput, dict, torch.Tensor]:
        return step_mismatch.correction(self, rollout, adv, logp_old, seed)

    def _ref_logp(self, rollout, seed):
        return step_mismatch.ref_logp(self, rollout, seed)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def save(self) -> Path | None:
        """Write a checkpoint (main process; under FSDP every process takes part in gathering the full tensors)."""
        return trainer_state.save(self)

    def resume(self, ckpt: Path | None) -> None:
        """Continue from `ckpt` (verified: run_dir.resume_checkpoint); None = no checkpoint yet, start over."""
        trainer_state.resume(self, ckpt)

    # ------------------------------------------------------------------------------------------------------ step
    def train_step(self) -> dict[str, float]:
        """One GRPO step; returns its metrics row."""
        cfg, tc, backend, step = self.cfg, self.tc, self.policy.backend, self.step
        G, device = cfg.grpo.num_generations, self.acc.device
        row: dict[str, float] = {M.STEP: step}
        t0 = time.perf_counter()

        rows = batch_rows(self.rows, step, tc.prompts_per_step, self.acc.process_index, self.acc.num_processes,
                           tc.seed)
        rows = [r for r in rows for _ in range(G)]  # each prompt's G generations contiguous
        prompts = [r["prompt"] for r in rows]
        ids, mask = encode_prompts(self.policy.tokenizer, prompts, chat=self.policy.use_chat_template, device=device)
        self.master.eval()
        t_sample = time.perf_counter()  # tokenisation is not rollout time
        rollout = backend.sample(self.rollout_model, ids, mask, step_generator(tc.seed, step, "sample", device))
        t_roll = time.perf_counter() - t_sample
        backend.prepare(rollout, step_generator(tc.seed, step, "mismatch", device))  # e.g. the trajectory plan
        n_tokens = int(rollout.completion_mask.sum())
        row.update({M.ROLLOUT_TOKENS_PER_S: generated_tokens(rollout) / max(t_roll, 1e-9),
                    M.ROLLOUT_STEPS: rollout.num_steps, M.ROLLOUT_GEN_LEN: n_tokens / len(rows),
                    M.ROLLOUT_NFE: rollout.num_steps if rollout.nfe is None else rollout.nfe,
                    M.time_key("rollout"): time.perf_counter() - t0})
        row.update(backend.rollout_metrics(rollout, G))

        tok = self.policy.tokenizer
        texts = [tok.decode(c[k], skip_special_tokens=True)
                 for c, k in zip(rollout.completion_ids, rollout.completion_mask, strict=True)]
        try:
            ids_kept = [c[k].tolist() for c, k in zip(rollout.completion_ids, rollout.completion_mask, strict=True)]
            chat = conversational_form(rows, bool(self.policy.use_chat_template and getattr(tok, "chat_template",
                                                                                            None)))
            scored = self.reward_fn(prompts, texts, rows, trainer_state=TrainerState(step, tc.steps),
                                    completion_ids=ids_kept, conversational=chat)
            rewards, error = scored.total.to(device), None
        except StepSkipped as e:
            rewards, error = None, e
        failed = self._any_process(error is not None)  # skip together, or the others would wait in the all-reduce
        self.reward_fn.record(failed, error)  # RewardFailure after too many failed steps in a row
        if failed:
            raise error or StepSkipped("another process's reward function failed")
        row[M.REWARD_MEAN] = float(rewards.mean())
        row[M.reward_key(tc.task)] = row[M.REWARD_MEAN]
        if len(scored.per_function) > 1:
            row.update({M.reward_key(f"fn/{name}"): v for name, v in scored.per_function.items()})
        adv_out = group_advantages(rewards, G, cfg.grpo.scale_rewards)
        adv = adv_out.adv
        row.update(adv_out.metrics())

        repeat = repeated_ngram_fraction(rollout.completion_ids, rollout.completion_mask, cfg.grpo.error_ngram)
        keep = error_keep(repeat, cfg.grpo.error_mask_threshold).to(device)  # [B] completions left in the loss
        row[M.ROLLOUT_REPEAT_FRAC] = float(repeat.mean())
        row[M.ROLLOUT_ERROR_MASKED] = float((~keep).float().mean())
        loss_mask = rollout.completion_mask & keep[:, None]  # [B, L]

        t1 = time.perf_counter()
        seeds = [step_seed(tc.seed, step, f"logp/{it}") for it in range(cfg.grpo.num_iterations)]
        logp_old = self._old_logp(rollout, seeds)
        row[M.time_key("old_logp")] = time.perf_counter() - t1
        t1 = time.perf_counter()
        corr, corr_metrics, logp_roll = self._correction(rollout, adv, logp_old[0], seeds[0])
        row.update(corr_metrics)
        loss_mask = rejected_loss_mask(corr.omega, loss_mask, cfg.correction)  # rejected=drop: out of the mask (verl)
        row[M.time_key("mismatch")] = time.perf_counter() - t1

        t2 = time.perf_counter()
        with torch.no_grad():
            once = backend.token_scale(rollout) is not None  # a trajectory policy: one replay serves every iteration
            logp_ref = [self._ref_logp(rollout, s) for s in (seeds[:1] if once else seeds)] if cfg.grpo.beta else None
            logp_ref = logp_ref * len(seeds) if once and logp_ref else logp_ref
        if tc.grad_diagnostics_every and step % tc.grad_diagnostics_every == 0:  # θ before this step's update
            self.model.train()
            ref0 = None if logp_ref is None else logp_ref[0]
            row.update(grad_diagnostics.measure(
                lambda idx, w: self._loss(rollout, idx, adv, w, logp_old[0], ref0, seeds[0], loss_mask, logp_roll).loss,
                [p for p in self.model.parameters() if p.requires_grad], corr.omega, loss_mask, G,
                self._token_mean, tc.gradient_accumulation_steps))
        losses = []
        for it, seed in enumerate(seeds):
            out = self._update(rollout, adv, corr.omega, logp_old[it], None if logp_ref is None else logp_ref[it],
                               seed, loss_mask, logp_roll)
            if out is not None:
                losses.append(out)
        row[M.time_key("update")] = time.perf_counter() - t2
        keys = (M.LOSS_POLICY, M.LOSS_CLIP, M.LOSS_CLIP_LOW, M.LOSS_CLIP_HIGH) + ((M.LOSS_KL,) if cfg.grpo.beta else ())
        for key in dict.fromkeys(keys + tuple(k for m in losses for k in m)):  # the loss's keys, in a stable order
            vals = [m[key] for m in losses if key in m]  # mean over the step's updates (num_iterations)
            row[key] = sum(vals) / len(vals) if vals else float("nan")
        if torch.isfinite(corr.lam):  # a NaN λ must not poison the EMA of every later step
            self.prev_lam = corr.lam
        t3 = time.perf_counter()
        self._sync_rollout()
        row[M.time_key("sync")] = time.perf_counter() - t3
        row[M.time_key("step")] = time.perf_counter() - t0
        return row

    def _update(self, rollout, adv, omega, logp_old, logp_ref, seed, mask, logp_roll) -> dict[str, float] | None:
        """One optimizer update over the batch (micro-batched); None if the loss was not finite (skipped).
        logp_roll [B, L]: log μ under the first iteration's masks (GRPOConfig.off_policy_mask_threshold reads it)."""
        self.model.train()
        B = adv.shape[0]
        chunks = self._micro_batches(B, adv.device)
        token_mean = self._token_mean
        # token-mean losses divide by the global batch's token count (TRL): this process's loss is its token sum
        # over (global tokens / processes), so that the average DDP takes over processes is the global token mean
        tokens_per_process = global_sum(self.acc, mask.sum()).clamp(min=1) / self.acc.num_processes
        metrics: dict[str, float] = {}
        finite = True
        for i, idx in enumerate(chunks):
            # DDP all-reduces the gradients in the last micro-batch's backward only (no_sync has to cover the
            # forward: DDP decides there whether the backward synchronises)
            sync = contextlib.nullcontext() if i == len(chunks) - 1 else self.acc.no_sync(self.model)
            with sync:
                out = self._loss(rollout, idx, adv, omega[idx], logp_old, logp_ref, seed, mask, logp_roll)
                # Each chunk's loss is a mean over its sequences (grpo, dr_grpo) or its tokens (bnpo, dapo); weight it
                # by its share of the batch's sequences or tokens, so the sum equals the full-batch loss.
                share = (mask[idx].sum() / tokens_per_process) if token_mean else idx.numel() / B
                loss = out.loss * share
                if self._any_process(not torch.isfinite(loss)):  # a collective decision: DDP all-reduces in backward
                    finite = False
                    break
                self.acc.backward(loss)
            for key, value in out.metrics().items():  # logged exactly as the loss is weighted
                metrics[key] = metrics.get(key, 0.0) + value * float(share)
        grads_ok = finite and not self._any_process(not all(p.grad is None or torch.isfinite(p.grad).all()
                                                            for p in self.model.parameters() if p.requires_grad))
        if not grads_ok:
            self._zero_grad()
            self.skipped += 1
            return None
        trained = self.model.parameters()
        if self.master_weights is not None:
            self.master_weights.grads_to_master()  # fp32 copies of the gradients: clip and step in fp32
            trained = self.master_weights.master
        if self.tc.max_grad_norm > 0:
            self.acc.clip_grad_norm_(trained, self.tc.max_grad_norm)
        self.optimizer.step()
        if self.master_weights is not None:
            self.master_weights.master_to_model()
        self._updated_this_step = True
        self.scheduler.step()
        self._zero_grad()
        return metrics

    @property
    def _own_loss(self) -> bool:
        """The policy likelihood trains on a loss of its own (SPG: rl/spg.py), not GRPO's ratio."""
        return bool(getattr(getattr(self.policy.backend, "policy", None), "own_loss", False))

    @property
    def _token_mean(self) -> bool:
        """The loss is a mean over the batch's tokens (DAPO, BNPO, SPG's length-weighted sum), not its sequences."""
        return self.cfg.grpo.loss_type in TOKEN_MEAN_LOSSES or self._own_loss

    def _loss(self, rollout, idx, adv, weights, logp_old, logp_ref, seed, mask, logp_roll):
        """The GRPO loss over rows idx alone, ω = weights ([len(idx)] or [len(idx), L]): the update's, per chunk."""
        cfg, backend = self.cfg, self.policy.backend
        if self._own_loss:  # SPG: the bound each sequence trains on, no ratio, no clip, no KL (β = 0 is enforced)
            with self._train_forward():
                bound = backend.sequence_logp(self.model, rollout, seed, adv[idx], rows=idx)  # [n]
            m = mask[idx]
            w = weights if weights.dim() == 1 else (weights * m).sum(-1) / m.sum(-1).clamp(min=1)
            return spg_loss(bound, adv[idx], m.sum(-1), weights=w)
        with self._train_forward():
            logp = backend.token_logp(self.model, rollout, seed, rows=idx)
        scale = backend.token_scale(rollout)  # HT step weights of a trajectory policy
        return grpo_loss(logp, logp_old[idx], adv[idx], mask[idx], cfg.grpo, weights=weights,
                         logp_ref=None if logp_ref is None else logp_ref[idx], logp_rollout=logp_roll[idx],
                         bypass_correction=cfg.correction if cfg.correction.bypass else None,
                         token_scale=None if scale is None else scale[idx])

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.master_weights is not None:  # the optimizer holds the fp32 masters, not the model's parameters
            self.model.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------------------------------------------ loop
    def fit(self) -> list[dict[str, float]]:
        """Run to `train.steps`. Returns the rows written by this call.

        The first Ctrl-C lets the current step finish, writes a checkpoint and raises KeyboardInterrupt; a second one
        (or any KeyboardInterrupt mid-step) stops at once, writing a checkpoint only if no update of the step has
        happened yet — a checkpoint is always a step boundary, so --resume reproduces the uninterrupted run. SIGTERM
        or SIGUSR1 (a scheduler's stop) on any process: every process finishes the step, a verified checkpoint is
        written and `Preempted` is raised (train/interrupt.py). Checkpoints are also written every `save_every`
        steps, every `save_every_minutes` of wall time and at the end (train/trainer_state.py).
        """
        main = self.acc.is_main_process
        writer = M.MetricsWriter(self.run.path, trackers.start(self.acc, self.cfg, self.run.path)) if main else None
        bar = None
        if self.progress and main:  # named by what it trains: "AIS-GRPO one_step", "SPG elbo" ...
            bar = progress_bar(total=self.tc.steps, initial=self.step, unit="step",
                               desc=f"{self.cfg.objective} {self.tc.policy_logprob}")
        written, self.first_step = [], self.step  # first_step: where this call started (after a resume)
        restore = install_sigint(lambda: self._stop_reason is not None, lambda why: setattr(self, "_stop_reason", why),
                                 resume_command(self.run.path))
        clock = trainer_state.SaveClock(self.tc.save_every_minutes)
        preempted = False
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
                # one decision for every process: a signal on any of them stops all at this step
                ctrl_c, preempted, due = self._agree(self._stop_reason == "Ctrl-C",
                                                     self._stop_reason not in (None, "Ctrl-C"), clock.due())
                if ctrl_c or preempted:
                    raise KeyboardInterrupt
                if self.step < self.tc.steps and (due or self.tc.save_every and self.step % self.tc.save_every == 0):
                    trainer_state.checkpoint(self, clock)
        except KeyboardInterrupt:
            if self._updated_this_step:
                latest = self.run.latest()
                print(f"\ninterrupted during an update of step {self.step}: no checkpoint written (it would not be a "
                      f"step boundary); the newest is {latest}", file=sys.stderr)
            else:
                path = trainer_state.checkpoint(self, clock, verify=preempted)
                if preempted:
                    self.acc.wait_for_everyone()  # no process exits before the checkpoint is written and verified
                    trainer_state.report_preempted(self, path)
                    raise trainer_state.Preempted(self._stop_reason or "another process's signal") from None
                print(f"\ninterrupted: checkpoint written to {path}; continue with {resume_command(self.run.path)}",
                      file=sys.stderr)
            raise
        finally:
            restore(preempted)
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        trainer_state.checkpoint(self, clock)
        return written

    def _any_process(self, flag: bool) -> bool:
        """True if `flag` holds on any process (the same answer everywhere)."""
        return self._agree(flag)[0]

    def _agree(self, *flags: bool) -> list[bool]:
        """Each flag: True if it holds on any process (the same answers everywhere; one all-reduce for all)."""
        if self.acc.num_processes == 1:
            return [bool(f) for f in flags]
        t = torch.tensor([1.0 if f else 0.0 for f in flags], device=self.acc.device)
        return [v > 0 for v in self.acc.reduce(t, reduction="sum").tolist()]

    def _reduce(self, row: dict[str, float]) -> dict[str, float]:
        """Combine every metric over processes by its kind (metrics.REDUCTIONS: min, max, else mean)."""
        if self.acc.num_processes == 1:
            return row
        import torch.distributed as dist

        ops = {"mean": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

        def reduce(values: list[float], kind: str) -> list[float]:
            t = torch.tensor(values, dtype=torch.float64, device=self.acc.device)
            dist.all_reduce(t, op=ops[kind])
            return (t / self.acc.num_processes if kind == "mean" else t).tolist()

        return M.reduce_row(row, reduce)
