"""Fast-dLLM rollouts on CPU: NFE, wall time and accuracy of every cache × threshold setting against `none`.

  python scripts/bench_fast_rollouts.py                  # ~15 min on one core: build, SFT, measure, write the table
  python scripts/bench_fast_rollouts.py --smoke          # seconds: tiny shapes, checks the script runs

Model: a mid-size LLaDA built locally (our LLaDAModelLM, character-level tiny tokenizer; --d-model, --layers), SFT-
trained from scratch with the package's masked-diffusion SFT (`dllm_ais.train.sft.warm_up`) on a procedural task with
long completions, so its confidences are those of a trained model rather than of random weights: `shift` — the prompt is
--digits random digits and ">", the completion those digits each plus one (9 -> 0), then EOS to the end of the
--gen-length window. Train and held-out problems come from different seeds (--digits ≥ 16 makes an overlap
astronomically unlikely). Accuracy: the completion's leading digit run equals the answer exactly.

Rows, one per (temperature, cache, threshold), all on the same --eval-n held-out prompts in batches of --batch-size
(rows move block by block together: a batch's NFE is that of its slowest row): steps = --steps (default gen_length/2,
d1's setting: two tokens per forward), blocks of --block-length, low-confidence remasking. Per row: nfe (forward calls
per batch, summed over batches), nfe_ratio and wall_ratio vs the `none`/fixed-schedule row of that temperature,
wall_s (diffusion_sample calls only), accuracy and the paired accuracy delta vs that row with a 95% normal CI
(per-item differences), digit accuracy (per-position match of the leading digit run, over the longer of it and
the answer). At T > 0 (rows --t1-rows) also the trajectory view of the cache/threshold mismatch: every committed token's
log μ as recorded by the sampler (cached logits) against a replay of its recorded canvas through the same model,
exact and uncached — ℓ = Σ_j (replay − recorded) per sequence, its std, the ESS fraction of w = exp(ℓ), and the
replay's wall time against the rollout's (one full forward per recorded step, rows batched: the unsubsampled cost
of the trajectory estimator). The same for the FP8 rollout copy (per-Linear, torch reference backend) without cache:
recorded under FP8, replayed under the BF16 model.

Writes --out/results.json (config, machine, rows) and --out/README.md (the table); the checkpoint stays in
--work (not committed). Timings are for this machine at its load (recorded: `os.getloadavg()` at start and end).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

from dllm_ais.atomic import atomic_write_text
from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.samplers.diffusion import diffusion_sample

REPO = Path(__file__).resolve().parent.parent


def shift(digits: str) -> str:
    return "".join(str((int(d) + 1) % 10) for d in digits)


def problems(n: int, length: int, seed: int) -> list[tuple[str, str]]:
    """n (prompt, answer) pairs: `length` random digits + '>' -> their shift."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(rng.choice("0123456789") for _ in range(length))
        out.append((f"{s}>", shift(s)))
    return out


def leading_digits(text: str) -> str:
    text = text.lstrip()
    i = 0
    while i < len(text) and text[i].isdigit():
        i += 1
    return text[:i]


def build_and_train(args, tokenizer, log):
    from dllm_ais.models.tiny import tiny_model
    from dllm_ais.train.sft import sft_loss, warm_up

    ckpt = Path(args.work) / "model.pt"
    model = tiny_model(seed=args.seed, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                       mlp_hidden_size=args.mlp, max_sequence_length=args.digits + 1 + args.gen_length + 8)
    n_params = sum(p.numel() for p in model.parameters())
    if ckpt.is_file() and not args.retrain:
        model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True))
        log(f"loaded {ckpt} ({n_params / 1e6:.2f}M params)")
        return model.eval(), {"n_params": n_params, "sft_s": None, "loaded": str(ckpt)}
    pairs = problems(args.sft_pairs, args.digits, seed=args.seed + 1000)
    mask_id, eos = model.config.mask_token_id, model.config.eos_token_id

    def loss_fn(m, ids, mask, comp, gen):
        return sft_loss(m, ids, mask, comp, mask_id, gen)

    t0 = time.perf_counter()
    warm_up(model, tokenizer, pairs, steps=args.sft_steps, batch_size=args.sft_batch, lr=args.lr,
            gen_length=args.gen_length, loss_fn=loss_fn, eos_token_id=eos, seed=args.seed, progress=args.progress)
    sft_s = time.perf_counter() - t0
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), ckpt)
    log(f"SFT {args.sft_steps} steps x {args.sft_batch} in {sft_s:.0f} s ({n_params / 1e6:.2f}M params)")
    return model.eval(), {"n_params": n_params, "sft_s": sft_s}


@torch.no_grad()
def replay_logp(model, out, temperature: float, mask_id: int) -> tuple[torch.Tensor, float]:
    """log μ(y_j | canvas at y_j's commit step) under `model`, exact and uncached; rows batched per step.
    -> ([B, L] float64, seconds)."""
    t0 = time.perf_counter()
    P = out.prompt_ids.shape[1]
    attn = out.attention_mask
    got = torch.zeros(out.completion_ids.shape, dtype=torch.float64)
    for t in range(int(out.commit_step.max()) + 1):
        at = out.commit_step == t  # [B, L]
        rows = at.any(-1)
        if not rows.any():
            continue
        canvas = torch.where(out.commit_step[rows] < t, out.completion_ids[rows], mask_id)
        x = torch.cat([out.prompt_ids[rows], canvas], dim=1)
        logits = model(input_ids=x, attention_mask=attn[rows], positions=slice(P, None)).logits
        lp = proposal_logprobs(logits, out.completion_ids[rows], temperature, mask_id).double()
        got[rows] = torch.where(at[rows], lp, got[rows])
    return got, time.perf_counter() - t0


def run_setting(model, replay_model, tokenizer, rows, cfg: SamplerConfig, batch_size: int, seed: int,
                replay: bool) -> dict:
    from dllm_ais.models.load import encode_prompts

    mask_id, eos = model.config.mask_token_id, model.config.eos_token_id
    correct, digit_acc, nfe, wall, ells, replay_s = [], [], 0, 0.0, [], 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p for p, _ in chunk], chat=False)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + start)
        t0 = time.perf_counter()
        out = diffusion_sample(model, ids, mask, cfg, mask_id, (eos,), generator=gen)
        wall += time.perf_counter() - t0
        nfe += out.nfe
        for comp, keep, (_, answer) in zip(out.completion_ids, out.completion_mask, chunk, strict=True):
            got = leading_digits(tokenizer.decode(comp[keep], skip_special_tokens=True))
            correct.append(float(got == answer))
            digit_acc.append(sum(a == b for a, b in zip(got, answer, strict=False)) / max(len(answer), len(got)))
        if replay:
            got, s = replay_logp(replay_model, out, cfg.temperature, mask_id)
            replay_s += s
            ells.append((got - out.logp_rollout.double()).sum(-1))  # [b]: ℓ = log π_old − log μ over the trajectory
    row = {"nfe": nfe, "wall_s": wall, "correct": correct, "accuracy": sum(correct) / len(correct),
           "digit_accuracy": sum(digit_acc) / len(digit_acc)}
    if replay:
        ell = torch.cat(ells)
        w = torch.exp(ell - ell.max())
        row.update(ell_std=float(ell.std()), ell_mean=float(ell.mean()), ell_abs_max=float(ell.abs().max()),
                   ess_frac=float(w.sum() ** 2 / (w ** 2).sum() / len(w)), replay_s=replay_s,
                   replay_vs_rollout=replay_s / wall)
    return row


def paired_delta(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a − b) and its 95% normal half-width (per-item differences)."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    m = sum(d) / len(d)
    var = sum((x - m) ** 2 for x in d) / max(len(d) - 1, 1)
    return m, 1.96 * math.sqrt(var / len(d))


def table(rows: list[dict]) -> str:
    head = ("| T | rollout | cache | threshold | NFE | NFE ratio | wall s | wall ratio | accuracy | Δacc vs none "
            "(95% CI) | digit acc | ℓ std | ESS frac | replay/rollout |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def f(v, fmt):
        return "–" if v is None else format(v, fmt)

    for r in rows:
        delta = "–" if r.get("acc_delta") is None else f"{r['acc_delta']:+.3f} ± {r['acc_delta_ci']:.3f}"
        lines.append(f"| {r['temperature']:g} | {r['rollout']} | {r['cache']} | {f(r['threshold'], 'g')} | "
                     f"{r['nfe']} | {r['nfe_ratio']:.3f} | {r['wall_s']:.1f} | {r['wall_ratio']:.3f} | "
                     f"{r['accuracy']:.3f} | {delta} | {r['digit_accuracy']:.3f} | {f(r.get('ell_std'), '.4f')} | "
                     f"{f(r.get('ess_frac'), '.3f')} | {f(r.get('replay_vs_rollout'), '.2f')} |")
    return "\n".join(lines)


def write(args, out_dir: Path, steps: int, train_info: dict, results: list[dict], load_start, t_all: float,
          done: bool) -> dict:
    """results.json and README.md with the rows so far (rewritten after every row: a killed run keeps them)."""
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": args.threads,
               "torch": torch.__version__, "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
               "total_s": time.perf_counter() - t_all, "complete": done}
    config = dict(vars(args)) | {"steps": steps}
    payload = {"config": config, "machine": machine, "train": train_info,
               "rows": [{k: v for k, v in r.items() if k != "correct"} for r in results]}
    atomic_write_text(out_dir / "results.json", json.dumps(payload, indent=2) + "\n")
    readme = (f"# Fast-dLLM rollouts on CPU (scripts/bench_fast_rollouts.py)\n\n"
              f"Model: LLaDA d_model {args.d_model}, {args.layers} layers, {args.heads} heads, MLP {args.mlp} "
              f"({train_info['n_params'] / 1e6:.2f}M params), SFT {args.sft_steps} steps × {args.sft_batch} on "
              f"`shift` with {args.digits}-digit strings; gen_length {args.gen_length}, block {args.block_length}, "
              f"fixed schedule {steps} steps; {args.eval_n} held-out prompts, batch {args.batch_size}.\n"
              f"Machine: {machine['platform']}, {args.threads} thread(s), load average {load_start[0]:.1f} at start, "
              f"{machine['loadavg_end'][0]:.1f} at the last row (a shared machine: wall ratios are indicative)."
              + ("" if done else " **Partial: the run had not finished.**") + "\n\n"
              + table(results) + "\n\n" + __doc__.split("\n\n", 2)[2] + "\n")
    atomic_write_text(out_dir / "README.md", readme)
    return machine


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "fast_rollouts"))
    p.add_argument("--work", default="/tmp/bench_fast_rollouts", help="checkpoint directory (not committed)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (writes under --work, not --out)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--digits", type=int, default=40)
    p.add_argument("--gen-length", type=int, default=128)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="fixed-schedule steps (default gen_length / 2)")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--sft-pairs", type=int, default=20000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-n", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--thresholds", type=float, nargs="*", default=[0.9, 0.7])
    p.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0])
    p.add_argument("--t1-rows", default="none:-,none:0.9,prefix:-,prefix:0.9,dual:-,dual:0.9,dual:0.7",
                   help="cache:threshold rows run at T > 0 ('-' = fixed schedule; 'all' = every combination)")
    p.add_argument("--no-fp8", action="store_true", help="skip the FP8-copy trajectory row")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retrain", action="store_true", help="train even if --work holds a checkpoint")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.d_model, args.layers, args.heads, args.mlp, args.digits = 64, 2, 2, 128, 8
        args.gen_length, args.block_length, args.sft_steps, args.sft_batch, args.sft_pairs = 32, 16, 4, 4, 64
        args.eval_n, args.batch_size = 6, 3
        args.work = str(Path(args.work) / "smoke")
        args.out = args.work
        args.retrain = True
    torch.set_num_threads(args.threads)
    steps = args.steps or args.gen_length // 2
    from dllm_ais.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_lines = []

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
        log_lines.append(msg)

    load_start = os.getloadavg()
    t_all = time.perf_counter()
    model, train_info = build_and_train(args, tokenizer, log)
    rows_eval = problems(args.eval_n, args.digits, seed=args.seed + 2000)
    fp8 = None
    if not args.no_fp8:
        from dllm_ais.fp8 import quantize_model

        fp8 = quantize_model(model, backend="torch")
    results = []
    for temp in args.temperatures:
        base = None
        settings = [("bf16", c, t) for c in ("none", "prefix", "dual") for t in (None, *args.thresholds)]
        if temp > 0 and args.t1_rows != "all":
            settings = [("bf16", c, None if t == "-" else float(t))
                        for c, t in (item.split(":") for item in args.t1_rows.split(","))]
        if fp8 is not None and temp > 0:
            settings.append(("fp8", "none", None))
        for rollout, cache, th in settings:
            cfg = SamplerConfig(gen_length=args.gen_length, block_length=args.block_length, steps=steps,
                                temperature=temp, cache=cache, threshold=th, compile=False)
            sampler_model = fp8 if rollout == "fp8" else model
            # trajectory replay where ℓ can be nonzero: a cache or the FP8 copy (threshold alone records exact logits)
            row = run_setting(sampler_model, model, tokenizer, rows_eval, cfg, args.batch_size, args.seed,
                              replay=temp > 0 and (cache != "none" or rollout == "fp8"))
            row.update(temperature=temp, rollout=rollout, cache=cache, threshold=th)
            if base is None:
                base = row
            row["nfe_ratio"] = row["nfe"] / base["nfe"]
            row["wall_ratio"] = row["wall_s"] / base["wall_s"]
            if row is not base:
                row["acc_delta"], row["acc_delta_ci"] = paired_delta(row["correct"], base["correct"])
            log(f"T={temp:g} {rollout} cache={cache} threshold={th}: nfe {row['nfe']} ({row['nfe_ratio']:.3f}), "
                f"wall {row['wall_s']:.1f} s ({row['wall_ratio']:.3f}), acc {row['accuracy']:.3f}"
                + (f", ell std {row['ell_std']:.4f}, ESS {row['ess_frac']:.3f}" if "ell_std" in row else ""))
            results.append(row)
            write(args, out_dir, steps, train_info, results, load_start, t_all, done=False)
    machine = write(args, out_dir, steps, train_info, results, load_start, t_all, done=True)
    log(f"wrote {out_dir}/results.json and README.md in {machine['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
