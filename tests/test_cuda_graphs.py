"""CUDA graphs for sampler steps (samplers/cuda_graphs.py, samplers/diffusion_graphs.py, SamplerConfig.cuda_graphs).

On CPU: the refusal of 'on' off CUDA (before the model is called), 'auto' staying eager there, the 'auto' fallback
with a warning when a capture fails, and the graph wrapper's buffer logic with `eager_capture` injected (a stand-in
whose replay re-runs the captured callable on the static buffers and rewrites the captured output): replays with new
inputs give the eager logits, the window-start buffer is honoured, whole rollouts through the graphed steps equal
eager ones, and a later call reuses the captured graphs. On CUDA: real captures against eager, BF16 and FP8.
"""

from __future__ import annotations

import functools

import pytest
import torch
from test_sampler import EOS, MASK, PROMPTS, _encode

from dllm_ais.config import SamplerConfig
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.llada.fused_fp8 import build_fused_llada
from dllm_ais.models.tiny import tiny_model
from dllm_ais.samplers import cuda_graphs, diffusion, diffusion_graphs
from dllm_ais.samplers.diffusion import diffusion_sample


def _canvas(B: int = 3, P: int = 10, L: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, 100, (B, P + L), generator=g)
    x[:, P + 4:] = MASK
    attn = torch.ones(B, P + L, dtype=torch.bool)
    attn[0, :3] = False
    return x, attn


def test_modes_and_refusals():
    assert SamplerConfig().cuda_graphs == "auto"
    with pytest.raises(ValueError, match="cuda_graphs='sometimes'"):
        SamplerConfig(cuda_graphs="sometimes")
    assert cuda_graphs.use_graphs("auto", "cpu") is False and cuda_graphs.use_graphs("off", "cpu") is False
    assert cuda_graphs.use_graphs("off", "cuda") is False and cuda_graphs.use_graphs("auto", "cuda") is True
    with pytest.raises(ValueError, match="needs CUDA but the rollouts run on cpu: use --cuda-graphs auto"):
        cuda_graphs.use_graphs("on", "cpu")


def test_on_refuses_on_cpu_before_the_model_runs():
    model = tiny_model(seed=0)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    ids, mask = _encode(PROMPTS)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, cache="dual", cuda_graphs="on")
    with pytest.raises(ValueError, match="cuda_graphs='on' needs CUDA"):
        diffusion_sample(model, ids, mask, cfg, MASK, (EOS,))
    assert calls == [] and model not in diffusion_graphs._RUNNERS
    diffusion_sample(model, ids, mask, SamplerConfig(**{**cfg.__dict__, "cuda_graphs": "auto"}), MASK, (EOS,))
    assert calls and model not in diffusion_graphs._RUNNERS  # auto on CPU: eager, nothing captured


def test_graphed_call_copies_inputs_and_returns_the_static_output():
    def fn(a, b):
        return a * 2 + b, a.sum(-1)

    a0, b0 = torch.arange(6.0).view(2, 3), torch.ones(2, 3)
    call = cuda_graphs.GraphedCall(fn, (a0, b0), cuda_graphs.eager_capture, warmup=1)
    assert call.static[0].data_ptr() != a0.data_ptr()  # static copies, not the caller's tensors
    first = call(a0, b0)
    a1, b1 = torch.randn(2, 3), torch.randn(2, 3)
    second = call(a1, b1)
    assert second[0] is first[0] and second[1] is first[1]  # the static output, rewritten by the replay
    torch.testing.assert_close(second[0], a1 * 2 + b1, rtol=0, atol=0)
    torch.testing.assert_close(second[1], a1.sum(-1), rtol=0, atol=0)
    assert call.graph.replays == 2
    with pytest.raises(ValueError, match="a CUDA graph holds one shape"):
        call(torch.zeros(3, 3), b1)


def _eager_window(model, cache: KVCache, window, attn, start):
    with torch.no_grad():
        return model(input_ids=window, attention_mask=attn, kv_cache=cache, window_start=start).logits


@pytest.mark.parametrize("fused", [False, True], ids=["master", "fused-fp8-torch"])
def test_window_start_buffer_is_honoured(fused):
    """One window graph captured at block start s1 replays the window at s2: the logits and the cache slots written
    equal an eager window step at s2 (a start baked into the graph would write and rotate at s1)."""
    model = tiny_model(seed=1)
    if fused:
        model = build_fused_llada(model, "torch")
    x, attn = _canvas()
    B, T = x.shape
    graphs = diffusion_graphs.SamplerGraphs("on", diffusion_graphs.model_step, cuda_graphs.eager_capture)
    cache = graphs.kv_cache(model, B, T)
    ref = KVCache.for_model(model, B, T)
    with torch.no_grad():
        for c in (cache, ref):  # the refresh
            model(input_ids=x, attention_mask=attn, kv_cache=c, window_start=0)
        pos = torch.arange(4).expand(B, -1)
        for s in (10, 14, 18):  # captured at 10, replayed at 14 and 18
            window = x[:, s:s + 4].clone()
            window[:, 0] = 7 + s  # new tokens committed in the window
            got = graphs.logits(model, window, attn, pos, cache, torch.tensor(s)).clone()
            want = _eager_window(model, ref, window, attn, s)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            for i in range(model.config.n_layers):
                torch.testing.assert_close(cache.k[i], ref.k[i], rtol=0, atol=1e-6)
                torch.testing.assert_close(cache.v[i], ref.v[i], rtol=0, atol=1e-6)
    assert len(graphs.calls) == 1 and next(iter(graphs.calls.values())).graph.replays == 3


def test_graphed_window_step_helper_equals_eager():
    model = tiny_model(seed=2)
    x, attn = _canvas(seed=2)
    B, T = x.shape
    cache, ref = KVCache.for_model(model, B, T), KVCache.for_model(model, B, T)
    with torch.no_grad():
        for c in (cache, ref):
            model(input_ids=x, attention_mask=attn, kv_cache=c, window_start=0)
        step = diffusion_graphs.graphed_window_step(model, cache, x[:, 18:26], attn, 18,
                                                    capture_fn=cuda_graphs.eager_capture)
        want = _eager_window(model, ref, x[:, 18:26], attn, 18)
        for _ in range(2):
            torch.testing.assert_close(step(), want, rtol=0, atol=1e-6)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Graphs 'on CPU': use_graphs answers as on CUDA and the runner captures with eager_capture."""
    real = cuda_graphs.use_graphs
    monkeypatch.setattr(cuda_graphs, "use_graphs", lambda mode, device, what="rollouts": real(mode, "cuda"))
    monkeypatch.setattr(diffusion, "_graph_runner", functools.partial(diffusion_graphs.runner,
                                                                      capture_fn=cuda_graphs.eager_capture))
    yield


@pytest.mark.parametrize("cache,threshold", [("none", None), ("dual", 0.5), ("prefix", None)])
def test_graphed_rollouts_equal_eager_and_reuse_their_graphs(fake_cuda, cache, threshold):
    model = tiny_model(seed=3)
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(20.0)  # confident: thresholds fire
    ids, mask = diffusion.pad_prompts_to_bucket(*_encode(PROMPTS), MASK)  # as graphed sampling pads: same canvases
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=1.0, cache=cache, threshold=threshold,
                        cuda_graphs="on")
    off = SamplerConfig(**{**cfg.__dict__, "cuda_graphs": "off"})
    runs = []
    for c in (cfg, off, cfg):
        g = torch.Generator().manual_seed(5)
        runs.append(diffusion_sample(model, ids, mask, c, MASK, (EOS,), g))
    graphed, eager, again = runs
    for out in (graphed, again):
        assert torch.equal(out.completion_ids, eager.completion_ids) and out.nfe == eager.nfe
        assert torch.equal(out.commit_step, eager.commit_step)
        torch.testing.assert_close(out.logp_rollout, eager.logp_rollout, rtol=0, atol=1e-6)
    runner = diffusion_graphs._RUNNERS[model][1]
    kinds = {"none": 1, "dual": 2, "prefix": 1 + cfg.num_blocks}[cache]  # full / refresh + window shapes
    assert len(runner.calls) == kinds
    replays = sum(c.graph.replays for c in runner.calls.values())
    assert replays == graphed.nfe + again.nfe  # every forward of both graphed calls replayed a graph
    diffusion_graphs.release(model)
    assert model not in diffusion_graphs._RUNNERS


def _failing_capture(fn, device, warmup=0, prepare=None, pool=None):
    raise RuntimeError("operation not permitted when stream is capturing")


def test_auto_falls_back_to_eager_with_a_warning_and_on_raises():
    model = tiny_model(seed=4)
    x, attn = _canvas(seed=4)
    B, T = x.shape
    pos = torch.arange(10, 18).expand(B, -1)
    want = diffusion_graphs.model_step(model, x, attn, pos).detach()
    auto = diffusion_graphs.SamplerGraphs("auto", diffusion_graphs.model_step, _failing_capture)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="cuda_graphs='auto': capturing the sampler's full step"):
        got = auto.logits(model, x, attn, pos, None, torch.tensor(0))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert auto.eager_reason and not auto.calls
    on = diffusion_graphs.SamplerGraphs("on", diffusion_graphs.model_step, _failing_capture)
    with torch.no_grad(), pytest.raises(RuntimeError, match="cuda_graphs='on': capturing the sampler's full step"):
        on.logits(model, x, attn, pos, None, torch.tensor(0))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _gpu_copy(kind: str):
    master = tiny_model(seed=6, dtype=torch.bfloat16).cuda()
    if kind == "bf16-master":
        return master
    from dllm_ais.fp8 import default_backend

    return build_fused_llada(master, default_backend("cuda"))


@CUDA
@pytest.mark.parametrize("kind", ["bf16-master", "fused-fp8"])
def test_real_capture_equals_eager_on_cuda(kind):
    model = _gpu_copy(kind)
    x, attn = (t.cuda() for t in _canvas(B=4, P=16, L=32, seed=6))
    B, T = x.shape
    cache, ref = KVCache.for_model(model, B, T), KVCache.for_model(model, B, T)
    with torch.no_grad():
        for c in (cache, ref):
            model(input_ids=x, attention_mask=attn, kv_cache=c, window_start=0)
        step = diffusion_graphs.graphed_window_step(model, cache, x[:, 16:32], attn, 16)
        want = _eager_window(model, ref, x[:, 16:32], attn, 16).float()
        torch.testing.assert_close(step().float(), want, rtol=0, atol=2e-2 * want.abs().max().item())
    ids, mask = (t.cuda() for t in _encode(PROMPTS))
    for compile_ in (False, True):
        cfg = SamplerConfig(gen_length=32, block_length=16, steps=16, cache="dual", compile=compile_,
                            cuda_graphs="on")
        out = diffusion_sample(model, ids, mask, cfg, MASK, (EOS,), torch.Generator("cuda").manual_seed(0))
        assert out.completion_ids.shape == (3, 32) and (out.commit_step >= 0).all()
        assert diffusion_graphs._RUNNERS[model][1].calls  # graphs were captured, not an eager fallback


def test_train_flags_refuse_on_for_cpu_rollouts():
    from dataclasses import replace

    from dllm_ais.presets import get_preset
    from dllm_ais.train.flags import check_combinations

    preset = get_preset("tiny-cpu")
    on = replace(preset, sampler=replace(preset.sampler, cuda_graphs="on"))
    with pytest.raises(ValueError, match="--cuda-graphs on needs CUDA rollouts but --device is cpu"):
        check_combinations({"--cuda-graphs": "on"}, on)
    check_combinations({}, preset)  # auto on CPU: fine (eager)
    cuda = replace(on, model=replace(on.model, device="cuda"))
    check_combinations({"--cuda-graphs": "on"}, cuda)


@pytest.mark.slow
def test_graphed_compiled_dual_cache_rollout_equals_eager(fake_cuda, monkeypatch):
    """With SamplerConfig.compile (inductor on CPU via DLLM_AIS_COMPILE_CPU) the runner captures the compiled step
    (inductor without its own graphs) over its per-layer cache: the rollout equals eager's tokens."""
    monkeypatch.setenv("DLLM_AIS_COMPILE_CPU", "1")
    monkeypatch.setattr(diffusion, "_GAVE_UP", set())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    diffusion._compiled_step.cache_clear()
    try:
        model = tiny_model(seed=7, n_layers=1, d_model=32, n_heads=2, mlp_hidden_size=64)
        ids, mask = diffusion.pad_prompts_to_bucket(*_encode(PROMPTS[:2]), MASK)
        cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, cache="dual", cuda_graphs="on")
        graphed = diffusion_sample(model, ids, mask, cfg, MASK, (EOS,))
        eager = diffusion_sample(model, ids, mask, SamplerConfig(**{**cfg.__dict__, "cuda_graphs": "off",
                                                                    "compile": False}), MASK, (EOS,))
        assert torch.equal(graphed.completion_ids, eager.completion_ids)
        assert torch.equal(graphed.commit_step, eager.commit_step)
        torch.testing.assert_close(graphed.logp_rollout, eager.logp_rollout, rtol=0, atol=1e-5)
        runner = diffusion_graphs._RUNNERS[model][1]
        assert len(runner.calls) == 2 and runner.eager_reason is None  # refresh + window, both captured
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # the compiled step was what ran
    finally:
        torch._dynamo.reset()
        diffusion._compiled_step.cache_clear()
