"""fp32 master weights: an update below bf16's resolution moves the master (and, accumulated, the bf16 weight)."""

import torch

from dllm_ais.train.master_weights import MasterWeights


def _step(param, master, optimizer):
    param.grad = torch.ones_like(param)  # AdamW's first steps move each weight by ≈ lr, whatever the gradient's size
    master.grads_to_master()
    optimizer.step()
    master.master_to_model()
    optimizer.zero_grad(set_to_none=True)
    param.grad = None


def test_update_smaller_than_bf16_resolution_moves_the_master():
    lr = 1e-4  # bf16 spacing at 1.0 is 2^-7 ≈ 7.8e-3: a step of 1e-4 rounds back to 1.0
    param = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    master = MasterWeights([param])
    assert master.master[0].dtype == torch.float32 and master.master[0] is not param
    optimizer = torch.optim.AdamW(master.master, lr=lr, weight_decay=0.0)
    _step(param, master, optimizer)
    torch.testing.assert_close(master.master[0], torch.full((64,), 1 - lr), rtol=0, atol=1e-7)
    assert torch.equal(param.detach(), torch.ones(64, dtype=torch.bfloat16)), "one step is below bf16's resolution"
    for _ in range(59):  # 60 steps ≈ 6e-3, past half the bf16 spacing below 1.0 (2^-9 ≈ 2e-3): the weight moves
        _step(param, master, optimizer)
    assert (param.detach().float() < 1.0).all()
    torch.testing.assert_close(param.detach(), master.master[0].to(torch.bfloat16), rtol=0, atol=0)

    # the same steps on the bf16 parameter itself are lost entirely: what the masters fix
    plain = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    opt = torch.optim.AdamW([plain], lr=lr, weight_decay=0.0)
    for _ in range(60):
        plain.grad = torch.ones_like(plain)
        opt.step()
    assert torch.equal(plain.detach(), torch.ones(64, dtype=torch.bfloat16))


def test_fp32_parameters_are_their_own_master_and_state_round_trips():
    full = torch.nn.Parameter(torch.randn(3, generator=torch.Generator().manual_seed(0)))
    half = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(1)).bfloat16())
    assert not MasterWeights.needed([full]) and MasterWeights.needed([full, half])
    master = MasterWeights([full, half])
    assert master.master[0] is full and master.master[1].dtype == torch.float32
    with torch.no_grad():
        master.master[1].add_(1e-4)
    saved = master.state_dict()
    assert len(saved) == 1 and torch.equal(saved[0], master.master[1])
    other = MasterWeights([full, torch.nn.Parameter(half.detach().clone())])
    other.load_state_dict(saved)
    assert torch.equal(other.master[1], saved[0]) and torch.equal(other.params[1], saved[0].bfloat16())


def test_model_to_master_follows_parameters_changed_outside_the_optimizer():
    """DDP's initial broadcast overwrites other ranks' parameters in prepare(): the fp32 masters must follow, or the
    first master_to_model() would bring back the rank's own pre-broadcast weights."""
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    mw = MasterWeights([p])
    with torch.no_grad():
        p.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # what a broadcast from rank 0 does
    mw.model_to_master()
    mw.master_to_model()
    assert torch.equal(mw.master[0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(p.detach().float(), torch.tensor([1.0, 2.0, 3.0, 4.0]))
