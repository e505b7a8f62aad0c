"""Estimator-variance study: std of the FP8/BF16 log-ratio ℓ versus forward passes, per estimator.

    dllm-ais variance --out runs/variance                     # tiny built-in model, ~minutes on a 2-core CPU
    dllm-ais variance --smoke --out /tmp/v                    # seconds (or: python scripts/variance.py ...)
    dllm-ais variance --model DIR --dtype bfloat16 --device cuda --out runs/variance-8b

Model a is the trainer copy (--dtype), model b its FP8 copy (`dllm_ais.fp8.quantize.quantize_model`). Sequences are
sampled from a few prompts with the diffusion sampler (by the FP8 copy, as rollouts are), or read from --data (jsonl
with "prompt" and "completion" text). For each estimator of `dllm_ais.likelihood.variance.ESTIMATORS` and each K,
ℓ is estimated R times per sequence with independent randomness; the std over the R estimates, averaged over
sequences, is reported against forward passes = forward rows per sequence = 2 models × K (one row = one sequence of
length P + L through one model; rows are batched --batch-size at a time). Writes variance.csv, variance.png and
variance.json (settings) to --out and prints the table.

--policy adds the policy likelihoods the trainer can use (analysis/policy_variance.py: one_step, elbo's three schemes,
coupled, spg's ELBO and EUBO): the std of each one's sequence log-likelihood and of its gradient norm against forward
rows per sequence, on model a, written to policy_variance.csv and printed after the ratio table.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from dllm_ais.progress import progress_bar

TINY_PROMPTS = ["12+7=", "3+45=", "Hello, ", "The cat ", "9*9=", "abc"]
LLADA_PROMPTS = [
    "What is 12 * 7? Think step by step.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May?",
    "Write a haiku about the sea.",
    "List three prime numbers greater than 20.",
]
FULL_KS = (1, 2, 4, 8, 16, 32, 64)
SMOKE_KS = (1, 2, 4)
CSV_COLUMNS = ("estimator", "K", "forward_passes", "rows_per_sequence", "std_log_ratio", "std_err", "mean_log_ratio",
               "std_elbo_a", "num_sequences", "repeats", "seconds")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dllm-ais variance", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local checkpoint directory of a diffusion family (LLaDA, Dream; the "
                   "family is read from its config.json; default: the tiny built-in LLaDA)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="trainer copy dtype")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--fp8-backend", default="torch", help="quantize_model backend (torch, triton, scaled_mm, torchao)")
    p.add_argument("--data", default=None, help="jsonl with prompt/completion text instead of sampling")
    p.add_argument("--num-sequences", type=int, default=None, help="use at most this many sequences")
    p.add_argument("--gen-length", type=int, default=None, help="completion length when sampling")
    p.add_argument("--steps", type=int, default=None, help="denoising steps when sampling (default: gen length)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--ks", default=None, help="comma-separated K values (default 1,2,4,8,16,32,64)")
    p.add_argument("--estimators", default=None, help="comma-separated subset of the estimators (default: all)")
    p.add_argument("--repeats", type=int, default=None, help="R, estimates per sequence and setting (default 16)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per model forward when estimating ELBOs (default: 256 for the tiny built-in model, "
                        "8 for a --model checkpoint; lower it if memory runs out)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling and mask draws (and the tiny model)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--smoke", action="store_true", help="seconds-long run: tiny model, K in 1,2,4, 4 repeats")
    p.add_argument("--policy", action="store_true", help="also the policy likelihoods (one_step, elbo schemes, "
                   "coupled, spg): std of the sequence log-likelihood and of its gradient norm per forward row")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def load_models(args):
    """(model_a, model_b, tokenizer, fp8_source): the trainer copy, its FP8 copy and how that copy was made."""
    import torch

    from dllm_ais.config import ModelConfig
    from dllm_ais.families import get_family
    from dllm_ais.models.load import detect_family

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    family = "llada" if args.model is None else detect_family(args.model)
    if not get_family(family).diffusion:
        raise ValueError(f"--model {args.model}: a {get_family(family).title} (autoregressive) checkpoint; `dllm-ais "
                         "variance` measures the diffusion likelihood estimators: pass a LLaDA or Dream directory.")
    model, tokenizer = get_family(family).load(ModelConfig(family=family, path=args.model, dtype=args.dtype,
                                                           device=device, seed=args.seed))
    try:
        from dllm_ais.fp8.quantize import quantize_model
    except ImportError:
        return model, weight_fp8_standin(model), tokenizer, "weight-only e4m3 stand-in (dllm_ais.fp8 missing)"
    return model, quantize_model(model, backend=args.fp8_backend), tokenizer, f"quantize_model({args.fp8_backend})"


def weight_fp8_standin(model):
    """A copy with every Linear except the LM head rounded to e4m3, one scale per output row (weights only)."""
    import copy

    import torch

    out = copy.deepcopy(model).eval()
    head = out.get_output_embeddings()
    with torch.no_grad():
        for mod in out.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not head:
                w = mod.weight.float()
                s = w.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0  # [out, 1]
                mod.weight.copy_(((w / s).to(torch.float8_e4m3fn).float() * s).to(mod.weight.dtype))
    return out


def sample_sequences(args, model_b, tokenizer, smoke: bool):
    """Prompts -> rollouts of the FP8 copy: (prompt_ids, prompt_mask, completion_ids, completion_mask)."""
    import torch

    from dllm_ais.config import SamplerConfig
    from dllm_ais.families import family_of_model
    from dllm_ais.models.load import encode_prompts

    prompts = TINY_PROMPTS if args.model is None else LLADA_PROMPTS
    prompts = prompts[:args.num_sequences or (2 if smoke else len(prompts))]
    gen = args.gen_length or (8 if smoke else 16 if args.model is None else 64)
    cfg = SamplerConfig(gen_length=gen, block_length=gen, steps=args.steps or gen, temperature=args.temperature)
    device = next(model_b.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts, chat=args.model is not None, device=device)
    g = torch.Generator(device=device).manual_seed(args.seed)
    backend = family_of_model(model_b).backend(cfg, model_b, tokenizer)  # the family's own sampler (Dream's, LLaDA's)
    r = backend.sample(model_b, ids, mask, g)
    return r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask


def read_sequences(args, model, tokenizer):
    """--data jsonl -> (prompt_ids, prompt_mask, completion_ids, completion_mask); completion + EOS count."""
    import torch

    from dllm_ais.models.load import encode_prompts

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    rows = rows[:args.num_sequences] if args.num_sequences else rows
    if not rows or any("prompt" not in r or "completion" not in r for r in rows):
        raise ValueError(f"--data {args.data}: need jsonl lines with 'prompt' and 'completion' fields.")
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], chat=args.model is not None, device=device)
    eos = model.config.eos_token_id
    comps = [tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + [eos] for r in rows]
    L = max(len(c) for c in comps)
    comp_ids = torch.full((len(rows), L), eos, dtype=torch.long, device=device)
    comp_mask = torch.zeros((len(rows), L), dtype=torch.bool, device=device)
    for i, c in enumerate(comps):
        comp_ids[i, :len(c)] = torch.tensor(c, device=device)
        comp_mask[i, :len(c)] = True
    return ids, mask, comp_ids, comp_mask


def plot(results, path: Path, title: str = "") -> None:
    """Log-log std of ℓ against forward passes, one line per estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name in dict.fromkeys(r.estimator for r in results):
        pts = [(r.forward_passes, r.std_log_ratio) for r in results if r.estimator == name and r.std_log_ratio > 0]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("forward passes per sequence (2 models × K rows)")
    ax.set_ylabel("std of ℓ = ELBO(model) − ELBO(FP8 copy)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(results) -> str:
    head = f"{'estimator':<12} {'K':>3} {'fwd':>4} {'std(ℓ)':>10} {'±':>9} {'mean(ℓ)':>10} {'std(ELBO)':>10} {'s':>6}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.estimator:<12} {r.K:>3} {r.forward_passes:>4} {r.std_log_ratio:>10.4g} {r.std_err:>9.2g} "
                     f"{r.mean_log_ratio:>10.4g} {r.std_elbo_a:>10.4g} {r.seconds:>6.1f}")
    return "\n".join(lines)


def check_out_dir(out: Path) -> None:
    """--out must be (or become) a directory: an existing file there, or a file among its parents, is a one-line
    error before any model is loaded (was a FileExistsError traceback from mkdir after the imports)."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            where = "" if path == out else f" ({path} is a file)"
            raise SystemExit(f"dllm-ais variance: error: --out {out}: not a directory{where}; --out names the output "
                             "directory.")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_out_dir(Path(args.out))
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch

    from dllm_ais.likelihood.variance import ESTIMATORS, measure

    if args.smoke and args.model is not None:
        raise SystemExit("--smoke runs the tiny built-in model; drop --model.")
    ks = tuple(int(k) for k in args.ks.split(",")) if args.ks else (SMOKE_KS if args.smoke else FULL_KS)
    names = args.estimators.split(",") if args.estimators else list(ESTIMATORS)
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown or any(k < 1 for k in ks):
        raise SystemExit(f"unknown estimator(s) {unknown} (known: {', '.join(ESTIMATORS)}) or K < 1 in {ks}.")
    repeats = args.repeats or (4 if args.smoke else 16)
    batch_size = args.batch_size or (256 if args.model is None else 8)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model_a, model_b, tokenizer, fp8_source = load_models(args)
    seqs = read_sequences(args, model_a, tokenizer) if args.data else sample_sequences(args, model_b, tokenizer,
                                                                                      args.smoke)
    tasks = [(n, k) for n in names for k in ks if ESTIMATORS[n].supports(k)]
    results = []
    bar = progress_bar(tasks, enabled=not args.no_progress, desc="variance", unit="setting")
    for i, (name, k) in enumerate(bar):
        bar.set_postfix_str(f"{name} K={k}")
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + i)
        results.append(measure(model_a, model_b, *seqs, ESTIMATORS[name], k, repeats, g, batch_size=batch_size))
    bar.close()

    with open(out / "variance.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({c: asdict(r)[c] for c in CSV_COLUMNS} for r in results)
    plot(results, out / "variance.png", title=f"{args.model or 'tiny'} {args.dtype} vs {fp8_source}, "
                                              f"{int(seqs[0].shape[0])} seqs × {repeats} repeats")
    meta = dict(argv=sys.argv if argv is None else ["variance", *argv], model=args.model or "tiny", dtype=args.dtype,
                fp8=fp8_source, device=str(next(model_a.parameters()).device), machine=platform.platform(),
                cpu_threads=torch.get_num_threads(), num_sequences=int(seqs[0].shape[0]),
                prompt_length=int(seqs[0].shape[1]), completion_length=int(seqs[2].shape[1]),
                counted_tokens=seqs[3].sum(-1).tolist(), repeats=repeats, ks=list(ks), time=time.ctime())
    (out / "variance.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"model={meta['model']} dtype={args.dtype} fp8={fp8_source} sequences={meta['num_sequences']} "
          f"counted tokens={meta['counted_tokens']} repeats={repeats}")
    print(format_table(results))
    print(f"wrote {out / 'variance.csv'}, {out / 'variance.png'}")
    if args.policy:
        policy_study(args, model_a, seqs, ks, repeats, out)
    return 0


def policy_study(args, model, seqs, ks: tuple[int, ...], repeats: int, out: Path) -> None:
    """--policy: each policy likelihood at each K it supports, on the trainer copy; policy_variance.csv."""
    import torch

    from dllm_ais.analysis.policy_variance import ROWS, format_policy_table, measure_policy, supports

    tasks = [(n, k) for n in ROWS for k in ks if supports(n, k)]
    results = []
    bar = progress_bar(tasks, enabled=not args.no_progress, desc="policy variance", unit="setting")
    for i, (name, k) in enumerate(bar):
        bar.set_postfix_str(f"{name} K={k}")
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + 7919 + i)
        results.append(measure_policy(model, seqs, name, k, repeats, g, mask_token_id=model.config.mask_token_id,
                                      block_length=int(seqs[2].shape[1])))
    bar.close()
    rows = [asdict(r) for r in results]
    with open(out / "policy_variance.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(format_policy_table(results))
    print(f"wrote {out / 'policy_variance.csv'}")


if __name__ == "__main__":
    sys.exit(main())
