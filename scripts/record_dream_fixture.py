"""Record tests/fixtures/dream_tiny from Dream's official code (run OUTSIDE this repository's environment).

Setup (once): a scratch folder SCRATCH with a virtual environment holding torch 2.13.0, transformers 4.46.3 and
safetensors, and two importable packages made from NVlabs/Fast-dLLM `dream/model/` (configuration_dream.py,
modeling_dream.py, generation_utils.py, generation_utils_block.py, __init__.py):
  SCRATCH/dream_official/   the files as they are
  SCRATCH/dream_hubpos/     the same, with the hub's `if position_ids is None:` restored in DreamBaseModel.forward
                            (Fast-dLLM's copy sets position_ids = arange(...) unconditionally)
Run: OMP_NUM_THREADS=1 SCRATCH/venv/bin/python scripts/record_dream_fixture.py SCRATCH OUT_DIR
It writes OUT_DIR/{config.json, generation_config.json, model.safetensors} (official layout, auto_map kept),
logits.safetensors (fp32) and logits_bf16.safetensors; what each tensor is: tests/fixtures/dream_tiny/README.md.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

V, MASK, PAD, BOS = 300, 297, 296, 295


def build(official, out: Path):
    """A tiny official-code Dream with non-trivial random weights, saved in the hub layout."""
    cfg = official.DreamConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               rope_theta=500.0, rms_norm_eps=1e-6, tie_word_embeddings=False, mask_token_id=MASK,
                               pad_token_id=PAD, eos_token_id=PAD, bos_token_id=BOS, torch_dtype="float32")
    cfg.auto_map = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}
    cfg.architectures = ["DreamModel"]
    torch.manual_seed(0)
    model = official.DreamModel(cfg).eval()
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # biases and norm scales must matter
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    model.save_pretrained(str(out), safe_serialization=True)
    data = json.loads((out / "config.json").read_text())
    assert data["model_type"] == "Dream" and "auto_map" in data, data
    return model


def canvases():
    """Unpadded [2, 12] and left-padded [3, 12] canvases, with generate's mask / tok_idx for the padded one."""
    gx = torch.Generator().manual_seed(7)
    x_u = torch.randint(0, BOS, (2, 12), generator=gx)
    x_u[0, 6:] = MASK
    x_u[1, [2, 5, 9, 10]] = MASK
    x_p = torch.randint(0, BOS, (3, 12), generator=gx)
    x_p[:, 8:] = MASK
    m_p = torch.ones(3, 12, dtype=torch.long)
    m_p[1, :3] = 0
    m_p[2, :7] = 0
    x_p[m_p == 0] = PAD
    tok_idx = m_p.long().cumsum(-1) - 1  # as generation_utils.py
    tok_idx.masked_fill_(m_p == 0, 1)
    mask4 = torch.logical_and(m_p.bool().unsqueeze(1).unsqueeze(-2), m_p.bool().unsqueeze(1).unsqueeze(-1))
    return x_u, x_p, m_p, tok_idx, mask4


def main(scratch: str, out_dir: str) -> None:
    sys.path.insert(0, scratch)
    official, hub = importlib.import_module("dream_official"), importlib.import_module("dream_hubpos")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build(official, out)
    model_hub = hub.DreamModel.from_pretrained(str(out)).eval()
    x_u, x_p, m_p, tok_idx, mask4 = canvases()
    with torch.no_grad():
        lu = model(x_u, "full", None).logits  # generate's no-padding path: SDPA mask None, positions arange
        lp_fast = model(x_p, mask4, tok_idx).logits
        lp_hub = model_hub(x_p, mask4, tok_idx).logits
    assert torch.isfinite(lp_fast).all() and torch.isfinite(lp_hub).all()
    meta = {"torch": torch.__version__, "transformers": importlib.import_module("transformers").__version__}
    save_file({"unpadded_input_ids": x_u, "unpadded_logits": lu.contiguous(), "padded_input_ids": x_p,
               "padded_attention_mask": m_p, "padded_tok_idx": tok_idx,
               "padded_logits_fastdllm": lp_fast.contiguous(), "padded_logits_hub": lp_hub.contiguous()},
              str(out / "logits.safetensors"), metadata=meta)
    bf16 = hub.DreamModel.from_pretrained(str(out), torch_dtype=torch.bfloat16).eval()
    with torch.no_grad():
        save_file({"unpadded_logits_bf16": bf16(x_u, "full", None).logits.contiguous(),
                   "padded_logits_hub_bf16": bf16(x_p, mask4, tok_idx).logits.contiguous()},
                  str(out / "logits_bf16.safetensors"), metadata=meta)
    print("wrote", out, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
