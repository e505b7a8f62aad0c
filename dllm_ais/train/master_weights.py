"""fp32 master weights for 16-bit parameters (bf16 full fine-tuning keeps small updates).

bf16 has 8 significant bits: a weight of magnitude 0.02 moves only if its update exceeds ~6e-5, so AdamW at lr 3e-6
changes a few percent of a bf16 model's weights per step and loses the rest. The optimizer therefore updates fp32
copies (the masters) and the model's bf16 parameters, used for every forward, are the masters rounded after each step:

    grads_to_master()   master.grad = fp32(param.grad)
    optimizer.step()    on the masters (AdamW state in fp32)
    master_to_model()   param = bf16(master)

Parameters that are already fp32/fp64 are their own master (no copy).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeights:
    """fp32 masters of a list of trainable parameters (one per parameter, in order)."""

    def __init__(self, params: Iterable[torch.Tensor]):
        self.params = list(params)
        self.master = [p.detach().float().clone() if p.dtype in LOW_PRECISION else p for p in self.params]
        """The tensors the optimizer updates: fp32 copies of 16-bit parameters, the parameter itself otherwise."""

    @staticmethod
    def needed(params: Iterable[torch.Tensor]) -> bool:
        """True when some parameter is bf16/fp16 (its updates would be rounded away without a master)."""
        return any(p.dtype in LOW_PRECISION for p in params)

    def _pairs(self):
        return ((p, m) for p, m in zip(self.params, self.master, strict=True) if m is not p)

    @torch.no_grad()
    def grads_to_master(self) -> None:
        """master.grad = fp32 copy of the parameter's gradient (None stays None)."""
        for p, m in self._pairs():
            m.grad = None if p.grad is None else p.grad.float()

    @torch.no_grad()
    def model_to_master(self) -> None:
        """Re-copy the parameters into the masters (after DDP's initial broadcast changed other ranks' parameters)."""
        for p, m in self._pairs():
            m.copy_(p)

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Round the masters into the model's parameters (in place)."""
        for p, m in self._pairs():
            p.copy_(m)

    def state_dict(self) -> list[torch.Tensor]:
        """CPU copies of the fp32 masters of the 16-bit parameters (for the checkpoint)."""
        return [m.detach().cpu().clone() for _, m in self._pairs()]

    @torch.no_grad()
    def load_state_dict(self, tensors: list[torch.Tensor]) -> None:
        """Restore what state_dict returned, then round it into the model's parameters."""
        pairs = list(self._pairs())
        if len(tensors) != len(pairs):
            raise ValueError(f"checkpoint holds {len(tensors)} master tensors, the model has {len(pairs)} 16-bit "
                             "trainable parameters: it was written for another model or precision.")
        for (p, m), t in zip(pairs, tensors, strict=True):
            m.copy_(t)
            p.copy_(m)
