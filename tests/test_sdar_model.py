"""SDAR's model in our own code against the official one (tests/fixtures/sdar_tiny/, recorded by
scripts/record_sdar_fixture.py from JetAstra/SDAR's modeling_sdar.py): whole block-causal canvases, cached block
forwards, prompts of several lengths in one padded batch (row by row against batch-1 official calls), the
two-stream training forward and its mask; and the checkpoint reader's refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais.models.checkpoint import CheckpointError, save_model
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.sdar.checkpoint import load_sdar, read_sdar_config
from dllm_ais.models.sdar.model import (
    block_canvas,
    block_causal_mask,
    block_diff_mask,
    two_stream_logits,
    two_stream_mask,
)
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.models.tiny import tiny_tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "sdar_tiny"
TOL = dict(rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def official():
    return load_sdar(FIXTURE, dtype=torch.float32), load_file(str(FIXTURE / "logits.safetensors"))


def test_whole_canvases_equal_the_official_logits(official):
    model, fx = official
    for i in range(3):
        x, Lb = fx[f"canvas{i}_ids"], int(fx[f"canvas{i}_block"])
        with torch.no_grad():
            got = model(input_ids=x, block_length=Lb).logits
        torch.testing.assert_close(got, fx[f"canvas{i}_logits"], **TOL)


def test_cached_block_forwards_equal_the_official_ones_in_one_padded_batch(official):
    """Four prompts (3, 8, 11, 5 tokens) with a committed slot in their next block: one padded batch laid out by
    block_canvas, prefilled in one forward, then every row's block against the cache = the official batch-1 calls."""
    model, fx = official
    rows = range(4)
    prompts = [fx[f"cached{i}_ids"][0, :int(fx[f"cached{i}_prompt_length"])] for i in rows]
    P = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.full((P - len(p),), 296), p]) for p in prompts])
    pmask = torch.stack([torch.arange(P) >= P - len(p) for p in prompts])
    canvas = block_canvas(ids, pmask, 4, 8, model.config.mask_token_id)
    x = canvas.ids.clone()
    for i in rows:  # the committed slot: one past the prompt's end
        x[i, canvas.prompt_end[i] + 1] = fx[f"cached{i}_ids"][0, len(prompts[i]) + 1]
    B, T = x.shape
    Q = canvas.first_block
    cache = KVCache.for_model(model, B, T)
    lo, hi = Q * 4, Q * 4 + 4
    with torch.no_grad():
        uncached = model(input_ids=x, attention_mask=canvas.keep, block_length=4).logits
        from dllm_ais.models.sdar.sampler import _prefill

        _prefill(model, x, canvas.keep, cache, lo, 4)
        keys = canvas.keep & (torch.arange(T) < hi)
        cached = model(input_ids=x[:, lo:hi], attention_mask=keys, kv_cache=cache, window_start=lo).logits
    for i in rows:
        torch.testing.assert_close(cached[i:i + 1], fx[f"cached{i}_block_logits"], **TOL)
        torch.testing.assert_close(uncached[i:i + 1, lo:hi], fx[f"cached{i}_block_logits"], **TOL)
        start = lo - (len(prompts[i]) // 4) * 4  # the row's first real column
        torch.testing.assert_close(uncached[i:i + 1, start:hi], fx[f"cached{i}_uncached_logits"], **TOL)


def test_two_stream_forward_and_mask_equal_the_official_training_layout(official):
    model, fx = official
    for i in range(2):
        Lb, noisy, clean = int(fx[f"two_stream{i}_block"]), fx[f"two_stream{i}_noisy"], fx[f"two_stream{i}_clean"]
        n = noisy.shape[1]
        assert torch.equal(two_stream_mask(n, Lb), fx[f"two_stream{i}_mask"])
        with torch.no_grad():
            got = two_stream_logits(model, noisy, clean, None, Lb)
        torch.testing.assert_close(got, fx[f"two_stream{i}_logits"], **TOL)


def test_block_diff_mask_matches_its_three_parts_on_awkward_sizes():
    """Against a loop over the official definition's three masks (modeling_sdar.py:316-327), n not a multiple of
    the block."""
    for n, Lb in ((5, 2), (7, 3), (6, 6)):
        m = block_diff_mask(torch.arange(2 * n)[:, None], torch.arange(2 * n)[None, :], Lb, n)
        for q in range(2 * n):
            for k in range(2 * n):
                cq, ck = q >= n, k >= n
                bq, bk = (q - n * cq) // Lb, (k - n * ck) // Lb
                want = (bq == bk and cq == ck) or (bq > bk and ck and not cq) or (bq >= bk and ck and cq)
                assert bool(m[q, k]) == want


def test_two_stream_gives_every_block_its_block_causal_logits_with_padding():
    """Each noisy block's two-stream logits = the block-causal forward of (clean blocks before it, the noisy block),
    on a padded two-row canvas (the second row has one block of left padding)."""
    model = tiny_sdar_model(seed=3, std=0.2)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(5, 100, (2, 12), generator=g)
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, :4] = False
    noisy = torch.where(torch.rand(2, 12, generator=g) < 0.5, 4, clean)
    with torch.no_grad():
        got = two_stream_logits(model, noisy, clean, keep, 4)
        for b in range(3):
            lo, hi = 4 * b, 4 * b + 4
            x = torch.cat([clean[:, :lo], noisy[:, lo:hi]], 1)
            want = model(input_ids=x, attention_mask=keep[:, :hi], block_length=4).logits[:, lo:hi]
            rows = [0, 1] if b > 0 else [0]  # row 1's block 0 is padding
            torch.testing.assert_close(got[rows, lo:hi], want[rows], rtol=0, atol=1e-5)


def test_block_causal_mask_and_canvas_layout():
    assert torch.equal(block_causal_mask(6, 2).long(), torch.tensor([[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2
                                                                    + [[1] * 6] * 2))
    ids = torch.tensor([[1, 1, 1, 7, 8], [9, 10, 11, 12, 13]])  # prompts of 2 and 5 tokens, left padded
    mask = ids != 1
    c = block_canvas(ids, mask, 4, 4, mask_token_id=4)
    # row 0: no full prompt block -> one padding block, its 2 tokens + 2 masks, then a block: ends at 12
    # row 1: one full prompt block, its tail (1 token) + 3 masks, then a block
    assert c.first_block == 1 and c.ids.shape == (2, 12)
    assert c.ids[0].tolist() == [4] * 4 + [7, 8, 4, 4] + [4] * 4
    assert c.ids[1].tolist() == [9, 10, 11, 12, 13, 4, 4, 4] + [4] * 4
    assert c.prompt_end.tolist() == [6, 5] and c.row_end.tolist() == [12, 12] and c.completion_length == 7
    with pytest.raises(ValueError, match="left-padded"):
        block_canvas(ids, torch.ones_like(mask).index_fill(1, torch.tensor([2]), False), 4, 4, 4)


def test_checkpoint_round_trip_and_one_line_refusals(tmp_path):
    model = tiny_sdar_model(seed=1)
    save_model(model, tiny_tokenizer(), tmp_path / "ckpt")
    data = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert data["model_type"] == "sdar" and data["architectures"] == ["SDARForCausalLM"]
    back = load_sdar(tmp_path / "ckpt", dtype=torch.float32)
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    # no mask token anywhere: refused in one line naming the file
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.pop("mask_token_id")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no mask token") as e:
        read_sdar_config(bad)
    assert "\n" not in str(e.value)
    # ... but tokenizer_config.json's mask_token is found (the official generate reads it from the tokenizer)
    (bad / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<|MASK|>", "added_tokens_decoder": {
        "297": {"content": "<|MASK|>", "special": False}}}))
    assert read_sdar_config(bad).mask_token_id == 297
    cfg["use_sliding_window"] = True
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="sliding"):
        read_sdar_config(bad)
