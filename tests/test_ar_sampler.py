"""Autoregressive sampler: recorded log-probs are the model's own, the KV-cache path equals a no-cache reference loop,
padding/batch invariance, stop handling, seeded reproducibility, and the top-k/top-p distribution it samples from.
The static-cache engine (compact rollout model, samplers/ar_static.py) is held to the same tests, and to the
DynamicCache sampler's exact tokens and log-probs."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import quantize_model
from dllm_ais.models.qwen.model import tiny_qwen, tiny_qwen_tokenizer
from dllm_ais.models.qwen.rollout import rollout_copy
from dllm_ais.samplers.ar_common import ARSamplerConfig, sample_tokens, sampling_logprobs
from dllm_ais.samplers.autoregressive import ar_sample

EOS = 1
PROMPTS = ["12+7=", "a much longer prompt!", "x"]
TOKENIZER = tiny_qwen_tokenizer()
CONFIGS = {
    "T1": ARSamplerConfig(max_new_tokens=10, temperature=1.0),
    "T0.7_topk_topp": ARSamplerConfig(max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9),
    "greedy": ARSamplerConfig(max_new_tokens=10, temperature=0.0),
}


@pytest.fixture(scope="module")
def model32():
    return tiny_qwen(seed=1, dtype=torch.float32)


@pytest.fixture(scope="module")
def model64():
    return tiny_qwen(seed=1, dtype=torch.float64)  # float64: no near-ties between batched and reference runs


@pytest.fixture(scope="module")
def fp8_model(model32):
    return quantize_model(model32, backend="torch")


@pytest.fixture(scope="module")
def models(model32, fp8_model):
    """The transformers model and its FP8 copy (DynamicCache sampler); the compact fused copies (static sampler)."""
    return {"fp32": model32, "fp8": fp8_model, "fused_fp32": rollout_copy(model32),
            "fused_fp8": rollout_copy(model32, fp8_backend="torch")}


def _encode(prompts, extra_pad: int = 0):
    enc = TOKENIZER(prompts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    if extra_pad:
        ids = torch.cat([torch.full((len(prompts), extra_pad), EOS), ids], dim=1)
        mask = torch.cat([torch.zeros(len(prompts), extra_pad, dtype=torch.bool), mask], dim=1)
    return ids, mask


def _sample(model, prompts, cfg, seed=0, stops=(EOS,), extra_pad=0):
    ids, mask = _encode(prompts, extra_pad)
    return ar_sample(model, ids, mask, cfg, stops, torch.Generator().manual_seed(seed))


def _teacher_forced_logits(model, out):
    """One full forward over [prompt | completion]: logits [B, L, V] that predicted each completion token."""
    P, L = out.prompt_ids.shape[1], out.completion_ids.shape[1]
    attn = out.attention_mask.long()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=out.sequences, attention_mask=attn, position_ids=pos).logits
    return logits[:, P - 1:P + L - 1]


@pytest.mark.parametrize("which", ["fp32", "fp8", "fused_fp32", "fused_fp8"])
@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_recorded_logprobs_equal_teacher_forced(models, which, cfg_name):
    model, cfg = models[which], CONFIGS[cfg_name]
    out = _sample(model, PROMPTS, cfg, seed=3)
    assert out.logp_rollout.dtype == torch.float32 and out.logp_rollout.shape == out.completion_ids.shape
    logits = _teacher_forced_logits(model, out)
    recomputed = sampling_logprobs(logits, cfg).gather(-1, out.completion_ids[..., None]).squeeze(-1)
    m = out.completion_mask
    assert m.sum() > 0
    torch.testing.assert_close(out.logp_rollout[m], recomputed[m].float(), atol=1e-5, rtol=0)
    assert (out.logp_rollout[~m] == 0).all()
    if cfg.top_k == 0 and cfg.top_p == 1:  # no truncation: plain (tempered) log-softmax, independent of the sampler
        T = cfg.temperature or 1.0
        plain = (logits.double() / T).log_softmax(-1).gather(-1, out.completion_ids[..., None]).squeeze(-1)
        torch.testing.assert_close(out.logp_rollout[m], plain[m].float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("which", ["fp8", "fused_fp8"])
def test_fp8_rollout_logprobs_are_its_own(models, which):
    """The FP8 copy's record differs from what the BF16/fp32 master assigns to the same tokens (a real mismatch)."""
    cfg = CONFIGS["T1"]
    out = _sample(models[which], PROMPTS, cfg, seed=4)
    master = sampling_logprobs(_teacher_forced_logits(models["fp32"], out), cfg)
    master = master.gather(-1, out.completion_ids[..., None]).squeeze(-1)[out.completion_mask].float()
    assert (out.logp_rollout[out.completion_mask] - master).abs().max() > 1e-5


def test_fused_fp32_copy_records_the_masters_logprobs(models):
    """In fp32 the compact copy is the master's policy: its record equals the transformers master's teacher-forced
    log-probs (the quantity the trainer's mismatch weight subtracts it from)."""
    cfg = CONFIGS["T0.7_topk_topp"]
    out = _sample(models["fused_fp32"], PROMPTS, cfg, seed=11, extra_pad=2)
    master = sampling_logprobs(_teacher_forced_logits(models["fp32"], out), cfg)
    master = master.gather(-1, out.completion_ids[..., None]).squeeze(-1).float()
    m = out.completion_mask
    torch.testing.assert_close(out.logp_rollout[m], master[m], atol=1e-5, rtol=0)


STOPS = tuple(range(1, 128, 9))  # 15 of 128 ids stop: most rows stop within 10 tokens, not all at once


@pytest.mark.parametrize("which", ["fp8", "fused_fp32", "fused_fp8"])
def test_recorded_logprobs_with_left_padding_and_early_stops(models, which):
    cfg = ARSamplerConfig(max_new_tokens=12, temperature=1.0)
    prompts = PROMPTS + ["7*6=", "(", "hello there"]
    out = _sample(models[which], prompts, cfg, seed=2, stops=STOPS, extra_pad=3)
    m = out.completion_mask
    lengths = m.sum(-1)
    assert (lengths < 12).any() and lengths.min() < lengths.max()  # early stops, at different steps
    logits = _teacher_forced_logits(models[which], out)
    recomputed = sampling_logprobs(logits, cfg).gather(-1, out.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logp_rollout[m], recomputed[m].float(), atol=1e-5, rtol=0)
    assert (out.logp_rollout[~m] == 0).all() and (out.completion_ids[~m] == STOPS[0]).all()


def _no_cache_reference(model, ids, mask, cfg, generator, stops=(EOS,)):
    """Plain loop: a full forward over the whole padded sequence for every new token (no KV cache)."""
    B = ids.shape[0]
    seq, attn = ids.clone(), mask.long()
    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(cfg.max_new_tokens):
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=seq, attention_mask=attn, position_ids=pos).logits[:, -1]
        logp = sampling_logprobs(logits, cfg)
        tok = sample_tokens(logp, cfg.temperature == 0, generator)
        lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        tok, lp = torch.where(done, stops[0], tok), torch.where(done, 0.0, lp)
        tokens.append(tok)
        logps.append(lp)
        done = done | torch.isin(tok, torch.tensor(stops))
        if done.all():
            break
        seq = torch.cat([seq, tok[:, None]], dim=1)
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype)], dim=1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_kv_cache_equals_no_cache_reference(model64, cfg_name):
    cfg = CONFIGS[cfg_name]
    ids, mask = _encode(PROMPTS)
    out = ar_sample(model64, ids, mask, cfg, (EOS,), torch.Generator().manual_seed(5))
    ref_tokens, ref_logp = _no_cache_reference(model64, ids, mask, cfg, torch.Generator().manual_seed(5))
    n = ref_tokens.shape[1]
    assert out.num_steps == n
    assert torch.equal(out.completion_ids[:, :n], ref_tokens)
    torch.testing.assert_close(out.logp_rollout[:, :n], ref_logp.float(), atol=1e-6, rtol=0)


def test_greedy_batch_and_padding_invariant(model64):
    cfg = CONFIGS["greedy"]
    batched = _sample(model64, PROMPTS, cfg)
    padded = _sample(model64, PROMPTS, cfg, extra_pad=5)
    assert torch.equal(batched.completion_ids, padded.completion_ids)
    for i, prompt in enumerate(PROMPTS):
        alone = _sample(model64, [prompt], cfg)
        assert torch.equal(alone.completion_mask[0], batched.completion_mask[i])
        m = alone.completion_mask[0]
        assert torch.equal(alone.completion_ids[0][m], batched.completion_ids[i][m])


def test_stop_tokens_mask_and_padding(model32):
    cfg = CONFIGS["greedy"]
    free = _sample(model32, PROMPTS, cfg, stops=(10**6,))  # an id outside the vocabulary: never emitted
    stop = int(free.completion_ids[0, 2])  # make row 0's third token a stop token
    out = _sample(model32, PROMPTS, cfg, stops=(stop,))
    for row in range(len(PROMPTS)):
        hits = (free.completion_ids[row] == stop).nonzero()
        first = int(hits[0]) if len(hits) else cfg.max_new_tokens - 1
        m = out.completion_mask[row]
        assert m[:first + 1].all() and not m[first + 1:].any()
        assert torch.equal(out.completion_ids[row, :first + 1], free.completion_ids[row, :first + 1])
        assert (out.completion_ids[row, first + 1:] == stop).all()  # finished rows keep emitting pad (= stop)
        assert (out.logp_rollout[row, first + 1:] == 0).all()
    assert torch.equal(out.commit_step, torch.arange(cfg.max_new_tokens).expand(len(PROMPTS), -1))


def test_all_rows_stopped_ends_decoding_early(model32):
    cfg = ARSamplerConfig(max_new_tokens=8, temperature=1.0)
    out = _sample(model32, PROMPTS, cfg, stops=tuple(range(128)), seed=0)  # every token stops
    assert out.num_steps == 1
    assert out.completion_ids.shape == (3, 8)
    assert out.completion_mask[:, 0].all() and not out.completion_mask[:, 1:].any()


def test_seeded_reproducible_and_global_rng_untouched(model32):
    cfg = CONFIGS["T1"]
    state = torch.get_rng_state()
    a, b = _sample(model32, PROMPTS, cfg, seed=7), _sample(model32, PROMPTS, cfg, seed=7)
    c = _sample(model32, PROMPTS, cfg, seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logp_rollout, b.logp_rollout)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def _reference_logprobs(z: torch.Tensor, T: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row, written plainly: temper, keep the top-k values (ties kept), then the nucleus, renormalise."""
    z = z.double() / T
    keep = set(range(len(z)))
    if top_k:
        kth = sorted(z.tolist(), reverse=True)[min(top_k, len(z)) - 1]
        keep = {v for v in keep if z[v] >= kth}
    if top_p < 1:
        probs = {v: float(p) for v, p in zip(sorted(keep), torch.softmax(z[sorted(keep)], 0), strict=True)}
        nucleus, mass = set(), 0.0
        for v in sorted(keep, key=lambda v: -probs[v]):
            if mass >= top_p:
                break
            nucleus.add(v)
            mass += probs[v]
        keep = nucleus
    out = torch.full_like(z, -torch.inf)
    idx = torch.tensor(sorted(keep))
    out[idx] = z[idx].log_softmax(0)
    return out


@pytest.mark.parametrize("T,top_k,top_p", [(1.0, 0, 1.0), (0.5, 3, 1.0), (1.3, 0, 0.6), (0.8, 4, 0.7), (1.0, 50, 0.99)])
def test_sampling_logprobs_matches_plain_reference(T, top_k, top_p):
    z = torch.randn(4, 9, generator=torch.Generator().manual_seed(0))
    cfg = ARSamplerConfig(temperature=T, top_k=top_k, top_p=top_p)
    got = sampling_logprobs(z, cfg)
    for row in range(4):
        torch.testing.assert_close(got[row], _reference_logprobs(z[row], T, top_k, top_p))
    assert torch.allclose(got.exp().sum(-1), torch.ones(4, dtype=torch.float64))


def test_sampled_frequencies_follow_recorded_distribution():
    z = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])
    cfg = ARSamplerConfig(temperature=0.9, top_k=5, top_p=0.85)
    logp = sampling_logprobs(z, cfg).expand(20000, -1)
    tokens = sample_tokens(logp, greedy=False, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=6).double() / len(tokens)
    p = logp[0].exp()
    assert (freq[p == 0] == 0).all() and (p == 0).sum() >= 2  # truncated tokens are never drawn
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / len(tokens)).sqrt() + 1e-12).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1), "temperature"), (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(temperature=0, top_k=5), "greedy"),
    (dict(temperature=0, top_p=0.9), "greedy"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ARSamplerConfig(**kwargs)


def test_rejects_right_padding_and_empty_rows(model32):
    ids, mask = _encode(PROMPTS)
    with pytest.raises(ValueError, match="LEFT-padded"):
        ar_sample(model32, ids, mask.flip(-1), CONFIGS["greedy"], (EOS,))
    mask = mask.clone()
    mask[0] = False
    with pytest.raises(ValueError, match="at least one real prompt token"):
        ar_sample(model32, ids, mask, CONFIGS["greedy"], (EOS,))


# ----------------------------------------------------------------------------------------------------------------------
# the static-cache engine against the DynamicCache sampler


@pytest.fixture(scope="module")
def fused64(model64):
    return rollout_copy(model64)


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("stops,extra_pad", [((EOS,), 0), (STOPS, 4)])
def test_static_sampler_equals_dynamic_cache_sampler(model64, fused64, cfg_name, stops, extra_pad):
    """Same generator, same prompts: identical tokens, masks, step counts and (float64 model) log-probs."""
    cfg = CONFIGS[cfg_name]
    ref = _sample(model64, PROMPTS, cfg, seed=9, stops=stops, extra_pad=extra_pad)
    got = _sample(fused64, PROMPTS, cfg, seed=9, stops=stops, extra_pad=extra_pad)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.completion_mask, ref.completion_mask)
    assert got.num_steps == ref.num_steps
    torch.testing.assert_close(got.logp_rollout, ref.logp_rollout, atol=1e-9, rtol=0)
    assert torch.equal(got.commit_step, ref.commit_step)


@pytest.mark.parametrize("engine", [
    dict(check_every=1), dict(check_every=3), dict(check_every=100), dict(prefill_chunk=1), dict(prefill_chunk=4),
])
def test_engine_settings_do_not_change_results(fused64, engine):
    from dllm_ais.samplers.ar_static import StaticDecodeConfig, static_ar_sample

    cfg = ARSamplerConfig(max_new_tokens=40, temperature=1.0)
    ids, mask = _encode(PROMPTS, extra_pad=2)
    base = static_ar_sample(fused64, ids, mask, cfg, STOPS, torch.Generator().manual_seed(4))
    other = static_ar_sample(fused64, ids, mask, cfg, STOPS, torch.Generator().manual_seed(4),
                             engine=StaticDecodeConfig(**engine))
    assert base.num_steps < 40  # every row stopped early, so check_every matters for the work done
    assert torch.equal(base.completion_ids, other.completion_ids) and base.num_steps == other.num_steps
    assert torch.equal(base.logp_rollout, other.logp_rollout) and torch.equal(base.completion_mask,
                                                                            other.completion_mask)


def test_static_decoder_reused_across_prompt_lengths(model64):
    """Consecutive calls with other prompt lengths reuse the buffers (and, on CUDA, the graph): results equal those of
    a fresh copy, and the sampler's buffers are not aliased by the returned rollout."""
    cfg = CONFIGS["T1"]
    warm = rollout_copy(model64)
    first = _sample(warm, PROMPTS, cfg, seed=1)
    decoder = warm._static_decoder[1]
    second = _sample(warm, PROMPTS[::-1], cfg, seed=2, extra_pad=3)
    assert warm._static_decoder[1] is decoder  # same batch, same capacity: reused
    fresh = _sample(rollout_copy(model64), PROMPTS[::-1], cfg, seed=2, extra_pad=3)
    assert torch.equal(second.completion_ids, fresh.completion_ids)
    torch.testing.assert_close(second.logp_rollout, fresh.logp_rollout, atol=0, rtol=0)
    again = _sample(rollout_copy(model64), PROMPTS, cfg, seed=1)
    assert torch.equal(first.completion_ids, again.completion_ids)  # not overwritten by the second call
    bigger = _sample(warm, PROMPTS + ["z"], cfg, seed=2)  # another batch size: a new decoder
    assert warm._static_decoder[1] is not decoder and bigger.completion_ids.shape == (4, 10)


def test_static_greedy_batch_and_padding_invariant(fused64):
    cfg = CONFIGS["greedy"]
    batched = _sample(fused64, PROMPTS, cfg)
    padded = _sample(fused64, PROMPTS, cfg, extra_pad=5)
    assert torch.equal(batched.completion_ids, padded.completion_ids)
    for i, prompt in enumerate(PROMPTS):
        alone = _sample(fused64, [prompt], cfg)
        m = alone.completion_mask[0]
        assert torch.equal(m, batched.completion_mask[i])
        assert torch.equal(alone.completion_ids[0][m], batched.completion_ids[i][m])


def test_static_seeded_and_global_rng_untouched(fused64):
    cfg = CONFIGS["T1"]
    state = torch.get_rng_state()
    a, b = _sample(fused64, PROMPTS, cfg, seed=7), _sample(fused64, PROMPTS, cfg, seed=7)
    c = _sample(fused64, PROMPTS, cfg, seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.completion_ids, b.completion_ids) and not torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("fp8_backend", [None, "triton"])
def test_cuda_graph_equals_eager_on_gpu(fp8_backend):
    """The captured decode step replays exactly what the eager step computes (same kernels, same buffers), and the
    recorded log-probs equal a teacher-forced pass of the same copy (bf16 noise bound)."""
    from dllm_ais.fp8 import unavailable_reason
    from dllm_ais.samplers.ar_static import StaticDecodeConfig, static_ar_sample

    if fp8_backend and unavailable_reason(fp8_backend, "cuda"):
        pytest.skip(unavailable_reason(fp8_backend, "cuda"))
    master = tiny_qwen(seed=1, dtype=torch.bfloat16).cuda()
    cfg = ARSamplerConfig(max_new_tokens=16, temperature=1.0)
    ids, mask = (t.cuda() for t in _encode(PROMPTS, extra_pad=2))
    runs = []
    for graph in (False, True):
        copy = rollout_copy(master, fp8_backend=fp8_backend)
        runs.append(static_ar_sample(copy, ids, mask, cfg, STOPS, torch.Generator("cuda").manual_seed(0),
                                     engine=StaticDecodeConfig(cuda_graph=graph, check_every=4)))
        assert (copy._static_decoder[1].graph is not None) == graph
    eager, graphed = runs
    assert torch.equal(eager.completion_ids, graphed.completion_ids)
    assert torch.equal(eager.logp_rollout, graphed.logp_rollout)
    logits = _teacher_forced_logits(copy, graphed)
    recomputed = sampling_logprobs(logits, cfg).gather(-1, graphed.completion_ids[..., None]).squeeze(-1)
    m = graphed.completion_mask
    torch.testing.assert_close(graphed.logp_rollout[m], recomputed[m].float(), atol=0.1, rtol=0)


def test_bf16_fused_copy_records_its_own_logprobs_to_bf16_noise():
    """bf16 on CPU: the cached decode attends over the whole (rounded-up) cache while a teacher-forced pass attends over
    exactly its own length, and SDPA's bf16 arithmetic differs between the two by a few bf16 ulps of the logits (with a
    cache of exactly the sequence's length both are bitwise equal). The recorded value is the one sampled from."""
    fused = rollout_copy(tiny_qwen(seed=1, dtype=torch.bfloat16))
    cfg = CONFIGS["T1"]
    out = _sample(fused, PROMPTS, cfg, seed=3, stops=STOPS, extra_pad=1)
    recomputed = sampling_logprobs(_teacher_forced_logits(fused, out), cfg)
    recomputed = recomputed.gather(-1, out.completion_ids[..., None]).squeeze(-1).float()
    m = out.completion_mask
    assert m.sum() > 3
    torch.testing.assert_close(out.logp_rollout[m], recomputed[m], atol=2e-2, rtol=0)
