"""Fast-dLLM rollouts (SamplerConfig.cache / threshold) against tests/fastdllm_reference.py, an independent plain
re-implementation of Fast-dLLM's generate / generate_with_prefix_cache / generate_with_dual_cache; the cached window
forward of every rollout copy against its full forward; logp_rollout against a replay of the recorded canvases."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import fastdllm_reference as ref
import pytest
import torch
from test_sampler import EOS, MASK, PROMPTS, TOKENIZER, _encode, _sample  # the same tiny vocabulary and helpers

from dllm_ais.config import SamplerConfig
from dllm_ais.fp8 import available_backends, quantize_model
from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.llada.fused_fp8 import build_fused_llada
from dllm_ais.models.tiny import tiny_model
from dllm_ais.samplers.diffusion import diffusion_sample, threshold_commit


def confident_model(seed: int = 3, scale: float = 40.0, dtype=torch.float64, **overrides):
    """A random tiny LLaDA whose LM head is scaled so that many proposals are confident (thresholds fire)."""
    model = tiny_model(seed=seed, dtype=dtype, **overrides)
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def model():
    return confident_model()



SETTINGS = [(16, 8, 8), (24, 8, 12), (16, 16, 8)]  # gen_length, block_length, steps
CASES = list(itertools.product(("none", "prefix", "dual"), (None, 0.9, 0.6)))


@pytest.mark.parametrize("cache,threshold", CASES, ids=[f"{c}-{t}" for c, t in CASES])
def test_tokens_and_nfe_equal_fastdllm_reference_batch1(model, cache, threshold):
    reference = ref.ReferenceLLaDA(model)
    fired = False
    for gen_length, block_length, steps in SETTINGS:
        cfg = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps, cache=cache,
                            threshold=threshold)
        for prompt in PROMPTS:
            ids = torch.tensor(TOKENIZER(prompt)["input_ids"])[None]
            expected, nfe = ref.GENERATORS[cache](reference, ids, steps, gen_length, block_length, MASK, threshold)
            out = diffusion_sample(model, ids, torch.ones_like(ids, dtype=torch.bool), cfg, MASK, (EOS,))
            assert torch.equal(out.completion_ids[0], expected[0, ids.shape[1]:]), (prompt, gen_length)
            assert out.nfe == nfe == out.num_steps, (prompt, gen_length, out.nfe, nfe)
            assert not (out.completion_ids == MASK).any() and (out.commit_step >= 0).all()
            fired |= threshold is not None and nfe < gen_length // 2  # parallel commits happened
    assert fired or threshold is None, "thresholds never fired: the comparison would not test parallel decoding"


@pytest.mark.parametrize("cache,threshold", [("none", 0.9), ("prefix", None), ("prefix", 0.7), ("dual", None),
                                             ("dual", 0.9)])
def test_batched_rows_equal_their_batch1_results(model, cache, threshold):
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, cache=cache, threshold=threshold)
    batch = _sample(model, PROMPTS, cfg)
    assert batch.nfe == batch.num_steps
    nfes = []
    for i, prompt in enumerate(PROMPTS):
        alone = _sample(model, [prompt], cfg)
        nfes.append(alone.nfe)
        assert torch.equal(alone.completion_ids[0], batch.completion_ids[i]), prompt
        if threshold is None:  # fixed schedule: the same steps in a batch as alone
            assert torch.equal(alone.commit_step[0], batch.commit_step[i])
            torch.testing.assert_close(alone.logp_rollout[0], batch.logp_rollout[i], atol=1e-5, rtol=0)
    # rows move block by block together: a batch takes at least as many forwards as its slowest row
    assert batch.nfe >= max(nfes)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_sampling_is_independent_of_bucket_padding(model, cache):
    """Extra left padding (as compiled sampling adds) leaves every row's tokens unchanged."""
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, cache=cache, threshold=0.8)
    ids, mask = _encode(PROMPTS)
    padded_ids = torch.cat([torch.full((3, 5), EOS), ids], dim=1)
    padded_mask = torch.cat([torch.zeros(3, 5, dtype=torch.bool), mask], dim=1)
    a = diffusion_sample(model, ids, mask, cfg, MASK, (EOS,))
    b = diffusion_sample(model, padded_ids, padded_mask, cfg, MASK, (EOS,))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.nfe == b.nfe


def _copy(name: str):
    """(rollout copy, relative logit tolerance of a cached window vs the full forward)."""
    master32 = confident_model(seed=5, scale=4.0, dtype=torch.float32)
    if name == "master-fp32":
        return master32, 1e-4
    if name == "fp8-per-linear":
        return quantize_model(master32, backend="torch"), 1e-4
    if name == "fused-fp8-torch":
        return build_fused_llada(master32, "torch"), 1e-4
    if name == "fp4-per-linear":
        from dllm_ais.fp4 import quantize_model as quantize_fp4

        return quantize_fp4(master32, "nvfp4"), 1e-4
    bf16 = confident_model(seed=5, scale=4.0, dtype=torch.bfloat16)
    if name == "fused-bf16":
        return build_fused_llada(bf16, None), 6e-2
    if "triton" not in available_backends("cpu"):
        pytest.skip("the triton backend cannot run here")
    return build_fused_llada(bf16, "triton"), 6e-2  # Triton producers + GEMM (interpreter on CPU)


@pytest.mark.parametrize("name", ["master-fp32", "fp8-per-linear", "fp4-per-linear", "fused-bf16", "fused-fp8-torch",
                                  pytest.param("fused-fp8-triton", marks=pytest.mark.slow)])  # interpreter: ~10-20 s
def test_cached_window_forward_equals_full_forward(name):
    """With the cache written from the same canvas, a window forward (prefix window to the end, dual window = one
    block) gives the full forward's logits at the window's positions, left padding included."""
    model, tol = _copy(name)
    ids, mask = _encode(PROMPTS)
    B, P = ids.shape
    g = torch.Generator().manual_seed(0)
    x = torch.cat([ids, torch.randint(5, 100, (B, 16), generator=g)], dim=1)
    x[:, P + 3:P + 9] = MASK
    attn = torch.cat([mask, torch.ones(B, 16, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        full = model(input_ids=x, attention_mask=attn).logits.float()  # [B, T, V]
        cache = KVCache.for_model(model, B, x.shape[1])
        refresh = model(input_ids=x, attention_mask=attn, kv_cache=cache, window_start=0).logits.float()
        assert torch.equal(refresh, full)
        s = P + 8
        for window in (x[:, s:], x[:, s:s + 8]):
            got = model(input_ids=window, attention_mask=attn, kv_cache=cache, window_start=s,
                        positions=slice(0, 8)).logits.float()
            torch.testing.assert_close(got, full[:, s:s + 8], atol=tol * full.abs().max().item(), rtol=0)
            got_t = model(input_ids=window, attention_mask=attn, kv_cache=cache,
                          window_start=torch.tensor(s)).logits.float()  # the start as a tensor (compiled path)
            torch.testing.assert_close(got_t[:, :8], got, atol=1e-6 * full.abs().max().item(), rtol=0)


@pytest.mark.parametrize("name", ["fp8-per-linear", "fp4-per-linear", "fused-fp8-torch"])
def test_quantized_copies_sample_with_dual_cache_and_threshold(name):
    model, _ = _copy(name)
    cfg = SamplerConfig(gen_length=32, block_length=8, steps=32, cache="dual", threshold=0.5, temperature=1.0)
    out = _sample(model, PROMPTS, cfg, seed=3)
    assert not (out.completion_ids == MASK).any() and (out.commit_step >= 0).all()
    assert out.nfe == out.num_steps == int(out.commit_step.max()) + 1
    assert torch.isfinite(out.logp_rollout).all() and (out.logp_rollout <= 0).all()


def _replayed_logp(model, out, temperature):
    """log μ(y_j | canvas at y_j's commit step), recomputed: canvas = prompt + tokens with commit_step < t."""
    B, P = out.prompt_ids.shape
    got = torch.zeros_like(out.logp_rollout, dtype=torch.float64)
    for b in range(B):
        for t in out.commit_step[b].unique().tolist():
            canvas = torch.where(out.commit_step[b] < t, out.completion_ids[b], MASK)
            x = torch.cat([out.prompt_ids[b], canvas])[None]
            attn = torch.cat([out.prompt_mask[b], torch.ones_like(canvas, dtype=torch.bool)])[None]
            with torch.no_grad():
                logits = model(input_ids=x, attention_mask=attn, positions=slice(P, None)).logits[0]  # [L, V]
            lp = proposal_logprobs(logits, out.completion_ids[b], temperature, MASK)
            at = out.commit_step[b] == t
            got[b, at] = lp[at].double()
    return got


@pytest.mark.parametrize("remasking,temperature,threshold", [("low_confidence", 1.0, None),
                                                             ("low_confidence", 0.7, 0.6),
                                                             ("random", 1.0, None), ("low_confidence", 0.0, 0.9)])
def test_logp_rollout_equals_a_replay_of_the_recorded_canvases(model, remasking, temperature, threshold):
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, remasking=remasking, temperature=temperature,
                        threshold=threshold)
    out = _sample(model, PROMPTS, cfg, seed=2)
    replay = _replayed_logp(model, out, temperature)
    assert (out.logp_rollout < 0).any()
    torch.testing.assert_close(out.logp_rollout.double(), replay, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_logp_is_the_cached_forward_not_a_replay(cache):
    """With a cache, logp_rollout comes from the cached forward: on the refresh step it equals the replay exactly
    (the cache is fresh), later steps carry the cache's approximation (small, nonzero somewhere)."""
    m = confident_model(scale=4.0)
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=1.0, cache=cache)
    out = _sample(m, PROMPTS, cfg, seed=4)
    replay = _replayed_logp(m, out, 1.0)
    refresh = out.commit_step % 4 == 0  # steps_per_block 4: each block's first step is its refresh
    torch.testing.assert_close(out.logp_rollout.double()[refresh], replay[refresh], atol=1e-5, rtol=1e-6)
    diff = (out.logp_rollout.double() - replay)[~refresh].abs()
    assert diff.max() > 1e-6 and diff.max() < 1.0


def test_threshold_commit_matches_fastdllm_get_transfer_index():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        masked = torch.rand(4, 12, generator=g) < 0.6
        masked[0] = False  # a row with no mask left commits nothing
        conf = torch.where(masked, torch.rand(4, 12, generator=g, dtype=torch.float64), -torch.inf)
        ours = threshold_commit(conf, masked, 0.7)
        for j in range(4):
            n = int(masked[j].sum())
            expected = torch.zeros(12, dtype=torch.bool)
            _, sel = torch.topk(conf[j], k=n)
            expected[sel] = True
            for k in range(1, n):
                if conf[j, sel[k]] < 0.7:
                    expected[sel[k]] = False
            assert torch.equal(ours[j], expected)


def test_cfg_with_a_cache_is_refused(model):
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, cache="dual", cfg_scale=1.0)
    with pytest.raises(ValueError, match="--cache none"):
        _sample(model, PROMPTS, cfg)


def test_sample_cli_flags(capsys):
    from dllm_ais.cli import main

    assert main(["sample", "--cache", "dual", "--threshold", "0.9", "--gen-length", "16", "--block-length", "8",
                 "--steps", "8", "--prompt", "12+3="]) == 0
    assert "### 12+3=" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sample", "--cache", "full"])


def test_eval_cli_flags_reach_the_sampler_and_d1_is_kept_without_them(tmp_path, monkeypatch):
    import argparse

    from dllm_ais.analysis import evaluate as ev

    seen = []
    monkeypatch.setattr(ev, "evaluate", lambda model, tok, task, sampler, **kw: seen.append(sampler) or {
        "task": task, "split": "test", "gen_length": sampler.gen_length, "n": 1, "accuracy": 0.0})
    parser = argparse.ArgumentParser()
    ev.add_eval_arguments(parser)
    for extra, cache, threshold in (([], "none", None), (["--cache", "dual", "--threshold", "0.9"], "dual", 0.9)):
        seen.clear()
        args = parser.parse_args(["--task", "digits", "--protocol", "strict", "--out", str(tmp_path), *extra])
        assert ev.cmd_eval(args) == 0
        assert seen[0].cache == cache and seen[0].threshold == threshold
    d1 = ev.d1_sampler(64)
    assert d1.cache == "none" and d1.threshold is None  # d1's sampler unless the flags are given


def test_bench_fast_rollouts_smoke(tmp_path):
    """scripts/bench_fast_rollouts.py runs end to end at tiny shapes and writes a consistent table."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_fast_rollouts.py"
    spec = importlib.util.spec_from_file_location("bench_fast_rollouts", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke", "--work", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "smoke" / "results.json").read_text())
    rows = res["rows"]
    assert {(r["temperature"], r["cache"], r["threshold"]) for r in rows} >= {(0.0, "dual", 0.9), (1.0, "prefix", None)}
    for r in rows:
        if r["rollout"] == "bf16" and r["cache"] == "none" and r["threshold"] is None:
            assert r["nfe_ratio"] == 1.0 and r["nfe"] == 2 * 16  # two batches × gen 32 / 2 steps
        if r["rollout"] == "fp8":
            assert r["ell_std"] > 0 and 0 < r["ess_frac"] <= 1
    assert "| T | rollout |" in (tmp_path / "smoke" / "README.md").read_text()


def test_trainer_counts_every_canvas_position_of_a_diffusion_rollout(model):
    """Diffusion rollouts now carry logp_rollout; the trainer's tokens/s must still count the whole canvas."""
    from dllm_ais.train.trainer import generated_tokens

    out = _sample(model, PROMPTS, SamplerConfig(gen_length=16, block_length=8, steps=8, threshold=0.9))
    assert out.logp_rollout is not None and generated_tokens(out) == out.completion_ids.numel()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_one_layer_caches_are_exact(cache):
    """In a 1-layer model a position's K/V depend on its own token only, and the positions a cache keeps stale (the
    prefix, or the still-masked positions after the block) do not change within a block: the cache is exact, so
    batched, left-padded sampling at T = 1 (same RNG draws) gives the uncached tokens, steps and log-probs."""
    m = confident_model(seed=7, scale=4.0, n_layers=1)
    for threshold, temperature in ((None, 1.0), (0.5, 0.0)):
        cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=temperature, threshold=threshold)
        ref_out = _sample(m, PROMPTS, cfg, seed=9)
        out = _sample(m, PROMPTS, SamplerConfig(**{**cfg.__dict__, "cache": cache}), seed=9)
        assert torch.equal(out.completion_ids, ref_out.completion_ids)
        if threshold is None:
            assert torch.equal(out.commit_step, ref_out.commit_step)
            torch.testing.assert_close(out.logp_rollout, ref_out.logp_rollout, atol=1e-6, rtol=0)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_one_step_per_block_is_the_refresh_only(model, cache):
    """steps = num_blocks: each block is one refresh forward, a full forward: identical to the uncached sampler."""
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=2, temperature=1.0)
    a = _sample(model, PROMPTS, cfg, seed=5)
    b = _sample(model, PROMPTS, SamplerConfig(**{**cfg.__dict__, "cache": cache}), seed=5)
    assert b.nfe == 2 and torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.commit_step, b.commit_step)


def test_threshold_commits_a_confidence_exactly_at_the_threshold():
    """Fast-dLLM commits `confidence >= threshold`: two positions at exactly τ both commit (with `>` only the top-1
    would); the rule's own test, fast, beside the sampler's."""
    conf = torch.tensor([[0.5, 0.5, 0.25, -torch.inf]], dtype=torch.float64)
    masked = torch.tensor([[True, True, True, False]])
    assert threshold_commit(conf, masked, 0.5).tolist() == [[True, True, False, False]]
    assert threshold_commit(conf, masked, 0.5 + 1e-12).tolist() == [[True, False, False, False]]


class _TiedLogits(torch.nn.Module):
    """Every position: two tokens with equal logits, the rest (mask included) impossible, so each confidence is
    exactly 0.5 (softmax of two ties)."""

    def forward(self, input_ids, attention_mask=None, positions=None, **kwargs):
        logits = torch.full((*input_ids.shape, 8), -torch.inf)
        logits[..., 5:7] = 0.0
        return SimpleNamespace(logits=logits if positions is None else logits[:, positions])


def test_the_sampler_commits_every_position_at_exactly_the_threshold_in_one_forward():
    cfg = SamplerConfig(gen_length=6, block_length=6, steps=6, temperature=0.0, threshold=0.5)
    ids, mask = torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool)
    out = diffusion_sample(_TiedLogits(), ids, mask, cfg, mask_token_id=7, stop_token_ids=(),
                           generator=torch.Generator().manual_seed(0))
    assert out.completion_ids.tolist() == [[5] * 6] and int(out.nfe) == 1  # `>` would take six forwards
