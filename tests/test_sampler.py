"""Masked-diffusion sampler against a plain one-sequence-at-a-time reference, plus schedule and block invariants."""

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.tiny import tiny_model, tiny_tokenizer
from dllm_ais.samplers.diffusion import completion_mask_from_stops, diffusion_sample, transfer_schedule

MASK, EOS = 4, 1
PROMPTS = ["12+7=", "a much longer prompt!", "x"]
TOKENIZER = tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1, dtype=torch.float64)  # float64: no near-ties between batched and reference runs


def _encode(prompts):
    enc = TOKENIZER(prompts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def _sample(model, prompts, cfg, seed=0):
    ids, mask = _encode(prompts)
    return diffusion_sample(model, ids, mask, cfg, MASK, (EOS,), torch.Generator().manual_seed(seed))


def reference_generate(model, prompt_ids, gen_length, block_length, steps, cfg_scale=0.0):
    """LLaDA's official generate for ONE unpadded prompt at temperature 0, written plainly with topk.

    As the official code: the proposal is the argmax of the full logits and its confidence the full softmax
    probability. Where the official code would commit the mask token itself (our sampler never proposes it), the
    reference stops with an AssertionError, so an equality below always compares like with like.
    """
    P = len(prompt_ids)
    x = torch.cat([prompt_ids, torch.full((gen_length,), MASK)])[None]
    steps_per_block = steps // (gen_length // block_length)
    for b in range(gen_length // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        n = int((x[0, lo:hi] == MASK).sum())
        ks = [n // steps_per_block + (1 if i < n % steps_per_block else 0) for i in range(steps_per_block)]
        for k in ks:
            logits = model(x).logits[0].double()
            if cfg_scale > 0:
                un = x.clone()
                un[0, :P] = MASK
                un_logits = model(un).logits[0].double()
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            x0 = logits.argmax(-1)
            p = torch.softmax(logits, -1).gather(-1, x0[:, None]).squeeze(-1)
            conf = torch.where(x[0] == MASK, p, -torch.inf)
            conf[:lo] = -torch.inf
            conf[hi:] = -torch.inf
            idx = torch.topk(conf, k).indices
            assert not (x0[idx] == MASK).any(), "the official generate would commit the mask token here"
            x[0, idx] = x0[idx]
    return x[0, P:]


class _NearTieModel(torch.nn.Module):
    """Logits that depend on the canvas, built so that renormalising without the mask token flips a near-tie.

    Completion of 2 tokens. While both are masked: position 0 proposes token 7 with p = 0.45 and gives the mask token
    p = 0.40; position 1 proposes token 8 with p = 0.50 and the mask token ~0. Once one position is committed, the
    other proposes token 9. Full softmax: position 1 (0.50 > 0.45) is committed first -> [9, 8]. Confidence
    renormalised over non-mask tokens: position 0 (0.45 / 0.60 = 0.75 > 0.50) first -> [7, 9].
    """

    V = 16

    def _row(self, probs: dict[int, float]) -> torch.Tensor:
        rest = (1.0 - sum(probs.values())) / (self.V - len(probs))
        p = torch.full((self.V,), rest, dtype=torch.float64)
        for tok, v in probs.items():
            p[tok] = v
        return p.log()

    def forward(self, input_ids, attention_mask=None, positions=None):
        B, T = input_ids.shape
        comp = input_ids[:, -2:]  # [B, 2]
        logits = torch.zeros(B, T, self.V, dtype=torch.float64)
        for b in range(B):
            if (comp[b] == MASK).all():
                logits[b, -2] = self._row({7: 0.45, MASK: 0.40})
                logits[b, -1] = self._row({8: 0.50, MASK: 1e-9})
            else:
                logits[b, -2:] = self._row({9: 0.9})
        if positions is not None:
            logits = logits[:, positions]
        return type("Out", (), {"logits": logits})()


def test_confidence_uses_the_full_softmax_mask_token_included():
    model = _NearTieModel()
    prompt = torch.tensor([5, 6, 10])
    ref = reference_generate(model, prompt, gen_length=2, block_length=2, steps=2)
    assert ref.tolist() == [9, 8]
    cfg = SamplerConfig(gen_length=2, block_length=2, steps=2)
    out = diffusion_sample(model, prompt[None], torch.ones(1, 3, dtype=torch.bool), cfg, MASK, (EOS,))
    assert out.completion_ids[0].tolist() == [9, 8]


@pytest.mark.parametrize("gen_length,block_length,steps,cfg_scale", [(12, 12, 6, 0.0), (12, 4, 6, 0.0),
                                                                      (8, 4, 8, 0.0), (8, 4, 4, 1.5)])
def test_matches_reference(model, gen_length, block_length, steps, cfg_scale):
    cfg = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps, cfg_scale=cfg_scale)
    out = _sample(model, PROMPTS, cfg)
    for i, prompt in enumerate(PROMPTS):
        prompt_ids = torch.tensor(TOKENIZER(prompt)["input_ids"])
        ref = reference_generate(model, prompt_ids, gen_length, block_length, steps, cfg_scale)
        assert torch.equal(out.completion_ids[i], ref), prompt


def test_deterministic_and_batch_invariant_at_temperature_zero(model):
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4)
    batch = _sample(model, PROMPTS, cfg, seed=0)
    again = _sample(model, PROMPTS, cfg, seed=123)
    assert torch.equal(batch.completion_ids, again.completion_ids)
    for i, prompt in enumerate(PROMPTS):
        alone = _sample(model, [prompt], cfg)
        assert torch.equal(alone.completion_ids[0], batch.completion_ids[i])
        assert torch.equal(alone.commit_step[0], batch.commit_step[i])


def test_padding_invariance(model):
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4)
    short = "12+7="
    for other in ("", "pad me by a lot of tokens please"):
        out = _sample(model, [short, other] if other else [short], cfg)
        ref = _sample(model, [short], cfg)
        assert torch.equal(out.completion_ids[0], ref.completion_ids[0])


@pytest.mark.parametrize("remasking,temperature", [("low_confidence", 0.0), ("low_confidence", 1.0),
                                                   ("random", 0.7)])
def test_commits_follow_schedule_and_blocks(model, remasking, temperature):
    cfg = SamplerConfig(gen_length=12, block_length=4, steps=9, remasking=remasking, temperature=temperature)
    out = _sample(model, PROMPTS, cfg, seed=7)
    assert out.num_steps == 9 and (out.commit_step >= 0).all()
    assert not (out.completion_ids == MASK).any()
    expected = torch.cat([transfer_schedule(torch.tensor([4]), 3)[0]] * 3)  # per global step
    for row in out.commit_step:
        assert torch.equal(torch.bincount(row, minlength=9), expected)
        blocks = row.view(3, 4)
        assert (blocks[:-1].max(-1).values < blocks[1:].min(-1).values).all(), "block b+1 started early"


def test_transfer_schedule_even_split_remainder_first():
    s = transfer_schedule(torch.tensor([7, 0, 3]), 3)
    assert s.tolist() == [[3, 2, 2], [0, 0, 0], [1, 1, 1]]


def test_seeded_sampling_is_reproducible_and_leaves_global_rng(model):
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=1.0)
    state = torch.get_rng_state()
    a, b = _sample(model, PROMPTS, cfg, seed=11), _sample(model, PROMPTS, cfg, seed=11)
    c = _sample(model, PROMPTS, cfg, seed=12)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_mask_token_is_never_committed(model):
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=5.0)  # near-uniform proposals
    for seed in range(4):
        assert not (_sample(model, PROMPTS, cfg, seed=seed).completion_ids == MASK).any()


def test_completion_mask_up_to_first_stop():
    comp = torch.tensor([[7, 8, 1, 9, 1], [7, 7, 7, 7, 7], [3, 9, 9, 9, 9]])
    mask = completion_mask_from_stops(comp, (1, 3))
    assert mask.tolist() == [[True, True, True, False, False], [True] * 5, [True, False, False, False, False]]


def test_bad_shapes_raise(model):
    ids, mask = _encode(PROMPTS)
    with pytest.raises(ValueError, match="prompt_mask"):
        diffusion_sample(model, ids, mask[:, 1:], SamplerConfig(), MASK, (EOS,))


@pytest.mark.parametrize("kwargs,match", [(dict(gen_length=10, block_length=4), "multiple of block_length"),
                                          (dict(gen_length=8, block_length=4, steps=3), "multiple of the number"),
                                          (dict(remasking="top"), "remasking"), (dict(temperature=-1), "temperature")])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplerConfig(**kwargs)
