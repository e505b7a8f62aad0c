"""Dream in the trainer (train/job.py family "dream", models/dream/backend.py): the backend's sampler settings, the
shifted SFT and mask-draw likelihoods against plain references, the trajectory ratio against the path likelihood,
the fused FP8 rollout copy synced in place by the trainer, and bad Dream checkpoints refused before any write."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch

from dllm_ais.config import PolicyLikelihoodConfig, SamplerConfig
from dllm_ais.models.shift import shift_logits
from dllm_ais.models.tiny import tiny_dream_model, tiny_tokenizer
from dllm_ais.presets import get_preset

FIXTURE = Path(__file__).parent / "fixtures" / "dream_tiny"
MASK = 4


def _backend(sampler: SamplerConfig, model=None, **train):
    from dllm_ais.families import get_family as family

    p = get_preset("tiny-dream")
    tc = replace(p.train, **train) if train else p.train
    return family("dream").backend(sampler, model if model is not None else tiny_dream_model(seed=0), None, tc)


def test_dream_family_backend_maps_the_sampler_settings():
    from dllm_ais.models.dream.backend import DreamBackend

    sampler = get_preset("tiny-dream").sampler  # names its rule: maskgit_plus
    backend = _backend(sampler)
    assert isinstance(backend, DreamBackend) and not backend.is_causal and backend.mask_token_id == MASK
    assert (backend.dream.alg, backend.dream.alg_temp, backend.dream.block_length) == ("maskgit_plus", 0.0, 5)
    unnamed = replace(sampler, dream_alg=None, dream_alg_temp=None)
    assert _backend(replace(unnamed, remasking="random")).dream.alg == "origin"
    model = tiny_dream_model(seed=0)
    model.sampling_defaults = {"alg": "entropy", "alg_temp": 0.5, "top_p": 0.9, "top_k": 7}
    d = _backend(unnamed, model).dream  # no rule named: the checkpoint's confidence rule
    assert (d.alg, d.alg_temp, d.top_p, d.top_k) == ("entropy", 0.5, 0.9, 7)
    d = _backend(replace(unnamed, dream_alg="topk_margin", dream_alg_temp=0.0), model).dream  # the flags win
    assert (d.alg, d.alg_temp, d.top_p, d.top_k) == ("topk_margin", 0.0, 0.9, 7)
    model.sampling_defaults = {"alg": "origin"}  # the released checkpoints': never taken for low_confidence
    assert _backend(unnamed, model).dream.alg == "maskgit_plus"
    assert _backend(sampler, model).dream.alg == "maskgit_plus"  # the preset's rule
    with pytest.raises(ValueError, match="--block-length 1 needs --cache prefix or dual"):
        _backend(replace(sampler, block_length=1))


def test_dream_sft_loss_reads_the_shifted_logits():
    """train/sft.py through the shifted view equals the loss computed by hand from shift_logits of a full forward."""
    from dllm_ais.train.sft import sft_loss

    model = tiny_dream_model(seed=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 100, (3, 6), generator=g)
    pmask = torch.ones(3, 6, dtype=torch.bool)
    pmask[1, :2] = False
    comp = torch.randint(5, 100, (3, 5), generator=g)
    got = sft_loss(model, prompt, pmask, comp, MASK, torch.Generator().manual_seed(7))
    g2 = torch.Generator().manual_seed(7)  # the same draws, by hand
    t = torch.rand(3, 1, generator=g2)
    p = (1 - 1e-3) * t + 1e-3
    masked = torch.rand(3, 5, generator=g2) < p
    x = torch.cat([prompt, torch.where(masked, MASK, comp)], 1)
    with torch.no_grad():
        logits = shift_logits(model(x, torch.cat([pmask, torch.ones_like(masked)], 1)).logits)[:, 6:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), comp, reduction="none")
    expected = torch.where(masked, nll / p, 0.0).sum() / 15
    torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)
    unshifted = torch.where(masked, torch.nn.functional.cross_entropy(
        model(x, torch.cat([pmask, torch.ones_like(masked)], 1)).logits[:, 6:].transpose(1, 2), comp,
        reduction="none") / p, 0.0).sum() / 15
    assert (unshifted.detach() - expected).abs() > 1e-3  # the shift matters on this model


def test_dream_mask_draw_likelihood_reads_the_shifted_logits():
    """The ELBO policy likelihood (likelihood/mask_draws.py) of a Dream equals that of a plain model whose logits
    are shift_logits of Dream's full forward."""
    from dllm_ais.likelihood.policy import policy_likelihood

    model = tiny_dream_model(seed=2)

    class Plain(torch.nn.Module):  # not shifted: the reference
        config = model.config

        def forward(self, input_ids, attention_mask=None, positions=None, **kw):
            full = shift_logits(model(input_ids, attention_mask).logits)
            return type("O", (), {"logits": full.gather(1, positions[..., None].expand(-1, -1, full.shape[-1]))})()

    g = torch.Generator().manual_seed(1)
    prompt, pmask = torch.randint(5, 100, (2, 4), generator=g), torch.ones(2, 4, dtype=torch.bool)
    comp, cmask = torch.randint(5, 100, (2, 5), generator=g), torch.ones(2, 5, dtype=torch.bool)
    lik = policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_draws=3))
    draw = lik.draw(prompt, pmask, cmask, 11)
    with torch.no_grad():
        got = lik.token_logp(model, prompt, pmask, comp, cmask, draw, mask_token_id=MASK)
        ref = lik.token_logp(Plain(), prompt, pmask, comp, cmask, draw, mask_token_id=MASK)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("cache", ["none", "dual", "prefix"])
def test_dream_trajectory_ratio_is_the_exact_replay(cache):
    """mismatch_estimator trajectory, as LLaDA's: ℓ = log π_old(path) − log μ(path) on the counted tokens (each with
    its step's selection term shared), π_old replayed with exact uncached logits, μ the sampler's record — which is
    the replay of the FP8 copy with the cache exactly as it ran. Rows whose every token is counted sum to the exact
    path-law difference when uncached; with a cache the sampler's record is the cached replay (exactly)."""
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.likelihood.trajectory import replay_plan, replay_terms, share_step_terms
    from dllm_ais.models.dream.trajectory import chunk_terms, path_logprob

    master = tiny_dream_model(seed=3)
    fp8 = quantize_model(master, backend="torch")
    sampler = SamplerConfig(gen_length=10, block_length=10 if cache == "none" else 5, steps=10 if cache == "none"
                            else 6, temperature=1.0, cache=cache)
    backend = _backend(sampler, master, mismatch_estimator="trajectory", trajectory_selection=True)
    prompt = torch.randint(5, 100, (6, 4), generator=torch.Generator().manual_seed(0))
    rollout = backend.sample(fp8, prompt, torch.ones_like(prompt, dtype=torch.bool), torch.Generator().manual_seed(1))
    backend.prepare(rollout, torch.Generator().manual_seed(2))
    tok = backend.mismatch_log_w(master, fp8, rollout, None, "token")  # [B, L]
    seq = backend.mismatch_log_w(master, fp8, rollout, None, "sequence")
    counted = rollout.completion_mask
    plan = replay_plan(rollout.commit_step, counted)
    with torch.no_grad():
        mu_t, mu_s = replay_terms(fp8, rollout, plan, backend.dream, mask_token_id=MASK, selection=True,
                                  chunk_terms=chunk_terms)  # the FP8 copy with the cache as it ran
        old_t, old_s = replay_terms(master, rollout, plan, backend.dream, mask_token_id=MASK, selection=True,
                                    chunk_terms=partial(chunk_terms, uncached=True))
    hit = plan.scale > 0
    torch.testing.assert_close(mu_t[hit].float(), rollout.logp_rollout[hit], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mu_s[hit], rollout.logp_select[hit], rtol=1e-5, atol=1e-5)
    expected = (old_t - mu_t) + share_step_terms(old_s - mu_s, rollout.commit_step, hit)
    torch.testing.assert_close(tok.double(), torch.where(counted, expected, 0.0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(seq, tok.sum(-1), rtol=1e-5, atol=1e-5)
    assert seq.abs().max() > 0  # FP8 differs
    full = counted.all(-1)
    if cache == "none" and bool(full.any()):
        with torch.no_grad():
            exact = path_logprob(master, rollout, backend.dream, MASK) - path_logprob(fp8, rollout, backend.dream, MASK)
        torch.testing.assert_close(seq[full].double(), exact[full], rtol=1e-4, atol=1e-4)
    zero = backend.mismatch_log_w(fp8, fp8, rollout, None, "token")
    assert torch.equal(zero, torch.zeros_like(tok)) == (cache == "none")  # a cache's staleness is a mismatch


def test_trainer_runs_dream_with_its_fused_fp8_copy_synced_after_each_step(tmp_path):
    """Two GRPO steps of tiny-dream: the rollout copy is models/dream/fused_fp8.py's and, after the last optimizer
    step's sync, equals a fresh copy of the trained master, which moved away from the SFT model (in-place buffers:
    tests/test_fp8_fused_dream.py)."""
    from dllm_ais import metrics as M
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.dream.fused_fp8 import FusedDream
    from dllm_ais.train.job import run_training

    p = get_preset("tiny-dream")
    p = replace(p, train=replace(p.train, steps=2, prompts_per_step=2, sft_steps=2, sft_batch_size=4),
                grpo=replace(p.grpo, num_generations=4))
    trainer = run_training(p, tmp_path / "run", progress=False)
    rollout = trainer.rollout_model
    assert isinstance(rollout, FusedDream)
    fresh = quantize_model(trainer.master, backend="torch")
    x = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(rollout(x).logits, fresh(x).logits)
    rows = M.read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(r[M.AIS_ESS] > 0 for r in rows)
    from dllm_ais.models.dream.checkpoint import load_dream

    sft = load_dream(tmp_path / "run" / "sft", dtype=torch.float32)
    assert any(not torch.equal(a, b) for a, b in zip(sft.state_dict().values(),
                                                      trainer.master.state_dict().values(), strict=True))


def _bad_checkpoint(tmp_path, config=None, generation=None) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, d)
    for name, edit in (("config.json", config), ("generation_config.json", generation)):
        if edit is not None:
            data = json.loads((d / name).read_text())
            edit(data)
            (d / name).write_text(json.dumps(data))
    tiny_tokenizer().save_pretrained(str(d))
    return d


@pytest.mark.parametrize("config, generation, says", [
    (None, lambda g: g.update(alg="greedy"), "alg='greedy' is not a Dream algorithm"),
    (None, lambda g: g.update(alg_temp=-0.1), "alg_temp=-0.1 must be a number >= 0"),
    (lambda c: c.pop("mask_token_id"), None, "missing field 'mask_token_id'"),
], ids=["unknown-alg", "negative-alg-temp", "no-mask-token"])
def test_bad_dream_checkpoint_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, config,
                                                                                generation, says):
    from dllm_ais.cli import main

    ckpt = _bad_checkpoint(tmp_path, config, generation)
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny-dream", "--model", str(ckpt), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_eval_protocol_d1_on_dream_generations(tmp_path):
    """`eval --protocol d1` with a Dream: d1's prompts, Dream's one-block generate (d1's LLaDA blocks dropped), the
    whole window decoded; rescoring the written generations gives the same accuracy."""
    from dllm_ais.analysis.evaluate import d1_sampler, evaluate, rescore

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": f"so #### {a + 1}"}) + "\n"
                            for a in range(3)))
    out = tmp_path / "out"
    scores = evaluate(tiny_dream_model(seed=0), tiny_tokenizer(), "gsm8k", d1_sampler(64), data_path=str(data),
                      out_dir=out, protocol="d1", family="dream")
    assert scores["protocol"] == "d1" and scores["n"] == 3
    assert (scores["gen_length"], scores["block_length"], scores["steps"]) == (64, 64, 32)
    rescored, rows = rescore([str(out / "generations.jsonl")], "gsm8k", "d1")
    assert rescored["n"] == 3 and rescored["accuracy"] == scores["accuracy"]
    assert all(r["completion"] for r in rows)


@pytest.mark.parametrize("flags, says", [
    (["--dream-alg", "origin", "--cache", "dual", "--mismatch-estimator", "trajectory"],
     "--dream-alg origin draws a random order"),
    (["--dream-alg", "entropy", "--threshold", "0.9", "--mismatch-estimator", "trajectory"],
     "threshold decoding reads maskgit_plus confidences"),
    (["--cuda-graphs", "on"], "--cuda-graphs on: Dream's sampler runs eager"),
    (["--preset", "tiny-cpu", "--dream-alg", "entropy"], "--dream-alg / --dream-alg-temp set Dream's position rule"),
], ids=["origin-cached", "threshold-with-entropy", "graphs-on", "dream-alg-on-llada"])
def test_what_dream_cannot_train_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, flags,
                                                                                      says):
    from dllm_ais.cli import main

    out = tmp_path / "run"
    preset = [] if "--preset" in flags else ["--preset", "tiny-dream"]
    assert main(["train", *preset, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_dream_trains_lora_adapters_on_the_block_linears(tmp_path, monkeypatch):
    """--lora-r on a Dream: peft wraps the seven block linears of every layer (dream.lora_target_regex), the run
    saves an adapter, and the fused FP8 copy is synced from the merged weights."""
    from dllm_ais import metrics as M
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.train.job import run_training
    from dllm_ais.train.run_dir import RunDir

    (tmp_path / "graded_dream_reward.py").write_text(  # graded, so that groups have spread and the step moves
        "def reward(prompts, completions, **columns):\n"
        "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]  # TRL: chat form\n"
        "    return [1.0 + sum(ch.isdigit() for ch in c) / 4 for c in texts]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = get_preset("tiny-dream")
    p = replace(p, train=replace(p.train, steps=1, prompts_per_step=2, sft_steps=0, lora_r=4, lora_alpha=8.0,
                                 learning_rate=1e-2, reward_fn="graded_dream_reward:reward"),
                grpo=replace(p.grpo, num_generations=4))
    trainer = run_training(p, tmp_path / "run", progress=False)
    lora = {n for n, _ in trainer.master.named_modules() if n.endswith("lora_A")}
    assert len(lora) == 2 * 7 and not any("lm_head" in n for n in lora)
    assert (RunDir(tmp_path / "run").latest() / "adapter" / "adapter_model.safetensors").is_file()
    x = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fresh = quantize_model(trainer.master, backend="torch")(x).logits
        assert torch.equal(trainer.rollout_model(x).logits, fresh)
        base = quantize_model(tiny_dream_model(seed=0), backend="torch")(x).logits
    assert not torch.equal(fresh, base)  # the adapters moved the copy
    assert M.read_metrics(tmp_path / "run")[0][M.REWARD_MEAN] >= 1.0  # the graded reward was used


def test_a_saved_dream_samples_as_the_run_did(tmp_path):
    """A run's backend leaves on the model what it samples with (`sampling_defaults`: the preset's rule, the
    checkpoint's top_p / top_k), and the family's save writes that as generation_config.json: the run's saved model
    (SFT cache, checkpoints) samples as the run did when eval or sample reload it — not as the hub's "origin"."""
    from dllm_ais.families import get_family as family
    from dllm_ais.models.dream.checkpoint import read_dream_sampling

    model = tiny_dream_model(seed=0)
    model.sampling_defaults = {"alg": "origin", "top_p": 0.9, "top_k": 7}  # as a released checkpoint, with filters
    sampler = replace(get_preset("tiny-dream").sampler, dream_alg="entropy", dream_alg_temp=0.25)
    _backend(sampler, model)
    runs = {"alg": "entropy", "alg_temp": 0.25, "top_p": 0.9, "top_k": 7}
    assert model.sampling_defaults == runs
    fam = family("dream")
    fam.save(model, tiny_tokenizer(), tmp_path / "m")
    assert read_dream_sampling(tmp_path / "m") == runs
    again = fam.load_dir(tmp_path / "m", dtype=torch.float32, device="cpu")
    unnamed = replace(sampler, dream_alg=None, dream_alg_temp=None)  # eval / sample without a rule of their own
    d = family("dream").backend(unnamed, again, None, None).dream
    assert (d.alg, d.alg_temp, d.top_p, d.top_k) == ("entropy", 0.25, 0.9, 7)
