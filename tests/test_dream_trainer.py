"""Dream in the trainer (train/job.py family "dream", models/dream/backend.py): the backend's sampler settings, the
shifted SFT and mask-draw likelihoods against plain references, the trajectory ratio against the path likelihood,
the fused FP8 rollout copy synced in place by the trainer, and bad Dream checkpoints refused before any write."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
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

    sampler = get_preset("tiny-dream").sampler
    backend = _backend(sampler)
    assert isinstance(backend, DreamBackend) and not backend.is_causal and backend.mask_token_id == MASK
    assert (backend.dream.alg, backend.dream.alg_temp, backend.dream.block_length) == ("maskgit_plus", 0.0, None)
    assert _backend(replace(sampler, remasking="random")).dream.alg == "origin"
    model = tiny_dream_model(seed=0)
    model.sampling_defaults = {"alg": "entropy", "alg_temp": 0.5, "top_p": 0.9, "top_k": 7}
    d = _backend(sampler, model).dream
    assert (d.alg, d.alg_temp, d.top_p, d.top_k) == ("entropy", 0.5, 0.9, 7)
    with pytest.raises(ValueError, match="--block-length 1 needs --cache prefix or dual"):
        _backend(replace(sampler, block_length=1))
    with pytest.raises(ValueError, match="policy-logprob trajectory"):
        _backend(sampler, policy_logprob="trajectory")


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


def test_dream_trajectory_ratio_is_the_path_likelihood_difference():
    """mismatch_estimator trajectory: sequence ℓ = log P_BF16(path) − log P_FP8(path) (dream_trajectory.path_logprob
    on each model); per token, rows whose every token is counted sum to it."""
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.dream.trajectory import path_logprob

    master = tiny_dream_model(seed=3)
    fp8 = quantize_model(master, backend="torch")
    sampler = SamplerConfig(gen_length=5, block_length=5, steps=5, temperature=1.0)
    backend = _backend(sampler, master, mismatch_estimator="trajectory", trajectory_selection=True)
    prompt = torch.randint(5, 100, (6, 4), generator=torch.Generator().manual_seed(0))
    rollout = backend.sample(fp8, prompt, torch.ones_like(prompt, dtype=torch.bool), torch.Generator().manual_seed(1))
    seq = backend.mismatch_log_w(master, fp8, rollout, None, "sequence")
    with torch.no_grad():
        expected = path_logprob(master, rollout, backend.dream, MASK) - path_logprob(fp8, rollout, backend.dream, MASK)
    torch.testing.assert_close(seq, expected.float())
    assert seq.abs().max() > 0  # FP8 differs
    tok = backend.mismatch_log_w(master, fp8, rollout, None, "token")
    full = rollout.completion_mask.all(-1)
    assert full.any()
    torch.testing.assert_close(tok.sum(-1)[full], seq[full], rtol=1e-4, atol=1e-5)
    assert torch.equal(backend.mismatch_log_w(fp8, fp8, rollout, None, "token"), torch.zeros_like(tok))


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
    (["--policy-logprob", "trajectory"], "--policy-logprob trajectory is LLaDA's replay"),
    (["--mismatch-estimator", "trajectory", "--trajectory-steps", "2"], "--trajectory-steps: Dream's trajectory"),
    (["--cache", "dual", "--mismatch-estimator", "trajectory"], "--cache dual: Dream's trajectory ratio"),
    (["--threshold", "0.9", "--mismatch-estimator", "trajectory"], "threshold decoding is Fast-dLLM's cached"),
    (["--cuda-graphs", "on"], "--cuda-graphs on: Dream's sampler runs eager"),
], ids=["trajectory-policy", "trajectory-steps", "cached-trajectory-ratio", "threshold-without-cache", "graphs-on"])
def test_what_dream_cannot_train_yet_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, flags,
                                                                                      says):
    from dllm_ais.cli import main

    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny-dream", *flags, "--out", str(out)]) == 2
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


def test_a_saved_dream_keeps_its_checkpoint_sampling_settings(tmp_path):
    """The family's save writes the checkpoint's alg / alg_temp / top_p / top_k as generation_config.json, so the run's
    saved model (SFT cache, final weights) samples as the run did when eval or sample reload it."""
    from dllm_ais.families import get_family as family
    from dllm_ais.models.dream.checkpoint import read_dream_sampling

    model = tiny_dream_model(seed=0)
    model.sampling_defaults = {"alg": "entropy", "alg_temp": 0.25, "top_p": 0.9, "top_k": 7}
    fam = family("dream")
    fam.save(model, tiny_tokenizer(), tmp_path / "m")
    assert read_dream_sampling(tmp_path / "m") == model.sampling_defaults
    again = fam.load_dir(tmp_path / "m", dtype=torch.float32, device="cpu")
    assert again.sampling_defaults == model.sampling_defaults
    assert _backend(get_preset("tiny-dream").sampler, again).dream.alg == "entropy"
