"""LLaDA architecture: official parameter names, bidirectionality, padding invariance, positions, checkpointing."""

import torch

from dllm_ais.models.llada.model import LLaDAModelLM
from dllm_ais.models.tiny import tiny_config, tiny_model


def _ids(B, T, seed=0, vocab=100):
    return torch.randint(5, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def test_official_parameter_names():
    model = tiny_model()
    names = set(model.state_dict())
    cfg = model.config
    expected = {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"}
    for i in range(cfg.n_layers):
        for leaf in ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"):
            expected.add(f"model.transformer.blocks.{i}.{leaf}.weight")
    assert names == expected
    assert model.get_output_embeddings() is model.model.transformer.ff_out


def test_bidirectional_later_token_changes_earlier_logits():
    model = tiny_model(dtype=torch.float64)
    ids = _ids(1, 12)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 100 + 5
    a, b = model(ids).logits, model(changed).logits
    assert not torch.allclose(a[0, 0], b[0, 0]), "position 0 must see the last token (no causal mask)"


def test_padding_invariance_of_logits():
    model = tiny_model(dtype=torch.float64)
    ids = _ids(1, 9)
    ref = model(ids, torch.ones_like(ids)).logits
    for pad in (1, 5, 17):
        padded = torch.cat([torch.full((1, pad), 1), ids], dim=1)
        mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], dim=1)
        out = model(padded, mask).logits[:, pad:]
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_positions_select_logits():
    model = tiny_model(dtype=torch.float64)
    ids = _ids(2, 10)
    full = model(ids).logits
    torch.testing.assert_close(model(ids, positions=slice(4, None)).logits, full[:, 4:], rtol=0, atol=1e-12)
    idx = torch.tensor([[0, 3, 9], [2, 2, 5]])
    picked = model(ids, positions=idx).logits
    torch.testing.assert_close(picked, torch.stack([full[b, idx[b]] for b in range(2)]), rtol=0, atol=1e-12)


def test_gradient_checkpointing_matches_plain_backward():
    model = tiny_model(dtype=torch.float64).train()
    ids = _ids(2, 8)
    model(ids).logits.square().mean().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # transformers 5 renamed the switch; older releases only have gradient_checkpointing_enable
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert model.model.gradient_checkpointing
    model(ids).logits.square().mean().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=1e-10, atol=1e-12, msg=n)


def test_bad_config_is_rejected_with_field_name():
    import pytest

    with pytest.raises(ValueError, match="mask_token_id"):
        LLaDAModelLM(tiny_config(mask_token_id=None))
    with pytest.raises(ValueError, match="n_heads"):
        LLaDAModelLM(tiny_config(n_heads=3))
