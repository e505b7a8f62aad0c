"""peft LoRA on every LLaDA block linear: wraps the right modules and a backward pass reaches every adapter."""

import torch
from peft import LoraConfig, get_peft_model

from dllm_ais.models.llada.model import LORA_TARGETS, lora_target_regex
from dllm_ais.models.tiny import tiny_model


def test_lora_wraps_all_block_linears_and_backward_reaches_every_adapter():
    model = tiny_model(seed=2).train()
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex(),
                                                  init_lora_weights="gaussian"))
    wrapped = {n.rsplit(".", 1)[0] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    n_layers = model.config.n_layers
    expected = {f"base_model.model.model.transformer.blocks.{i}.{t}" for i in range(n_layers) for t in LORA_TARGETS}
    assert {w.rsplit(".lora_A", 1)[0] for w in wrapped} == expected, "LM head must not be wrapped; all blocks must"
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at zero, which would zero A's gradient; give it values so both must move
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    ids = torch.randint(5, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    peft_model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    lora = [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n]
    assert len(lora) == 2 * len(expected)
    for n, p in lora:
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    frozen = [n for n, p in peft_model.named_parameters() if "lora_" not in n and p.requires_grad]
    assert frozen == []
