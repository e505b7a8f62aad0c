"""Flags shared by `train` and `sample`: the model (preset, checkpoint, device, dtype, seed) and the sampler."""

from __future__ import annotations

import argparse

from dllm_ais.commands.help import DEFAULT_PRESET
from dllm_ais.config import CACHE_MODES, CUDA_GRAPH_MODES, SDAR_STRATEGIES
from dllm_ais.families import FAMILIES
from dllm_ais.presets import PRESETS


def family_titles(diffusion_only: bool = False) -> str:
    """"LLaDA, Qwen, Dream": the registry's families (dllm_ais/families.py), for help texts."""
    return ", ".join(f.title for f in FAMILIES.values() if f.diffusion or not diffusion_only)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help=f"named preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    p.add_argument("--model", default=None, help="checkpoint directory or hub id of the preset's family "
                   f"({family_titles()}: the official hub layout; Qwen: save_pretrained's) with one of its presets; "
                   "overrides the preset's")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (refused where it is not "
                   "available)")
    p.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16, float16")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling noise and the tiny model's weights")


def add_sampler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-length", type=int, default=None, help="completion length in tokens")
    p.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block length")
    p.add_argument("--steps", type=int, default=None, help="total denoising steps")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--remasking", default=None, choices=["low_confidence", "random"],
                   help="which masked positions each step commits: the most confident ones, or random ones")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (0 = off)")
    add_fast_sampler_args(p)
    add_dream_args(p)


def add_dream_args(p: argparse.ArgumentParser) -> None:
    """Dream's position rule (`train` and `sample`; docs/models.md)."""
    from dllm_ais.config import POSITION_RULES

    p.add_argument("--dream-alg", default=None, choices=POSITION_RULES, help="Dream only: which masked positions a "
                   "step commits — entropy (Dream's evaluation rule), maskgit_plus (top-1 probability), topk_margin "
                   "(top-1 minus top-2) or origin (random order); overrides --remasking and the checkpoint's "
                   "generation_config.json (whose released 'origin' is never taken for low_confidence); default: the "
                   "preset's")
    p.add_argument("--dream-alg-temp", type=float, default=None, metavar="T", help="Dream only: 0 = commit the most "
                   "confident positions, > 0 = draw them from softmax(confidence / T); default: the preset's, else "
                   "the checkpoint's, else 0")


def add_fast_sampler_args(p: argparse.ArgumentParser, needs: str = "") -> None:
    """Fast-dLLM's cache and threshold and the CUDA graphs (`sample`; `train` adds what they need: `needs`)."""
    p.add_argument("--cache", default=None, choices=CACHE_MODES,
                   help="Fast-dLLM block KV cache: none (every step a full forward), prefix (one refresh forward per "
                   f"block caches what precedes it), dual (later steps recompute the current block only){needs}")
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="Fast-dLLM parallel decoding: each step commits every masked token of the block with "
                   f"confidence >= F (and at least one), in (0, 1]; default: the fixed schedule{needs}")
    p.add_argument("--sdar-strategy", default=None, choices=SDAR_STRATEGIES,
                   help="block diffusion (SDAR) only: which masked slots of the block each step commits — the "
                   "quota's most confident (static), every slot above --sdar-threshold when they reach the quota "
                   "(dynamic), or the quota's leftmost (sequential); default low_confidence_dynamic")
    p.add_argument("--sdar-threshold", type=float, default=None, metavar="F",
                   help="block diffusion (SDAR) only: low_confidence_dynamic's τ in (0, 1): slots with confidence "
                   "> F commit (default 0.9)")
    p.add_argument("--cuda-graphs", default=None, choices=CUDA_GRAPH_MODES,
                   help="replay each static-shape sampler forward (refresh, window, uncached step) from a CUDA "
                   "graph: auto = on for CUDA rollouts (eager, with a warning, where a capture fails), on = graphs or "
                   "a refusal, off = never (default auto)")
