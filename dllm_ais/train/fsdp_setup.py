"""What the trainer does differently under accelerate's FSDP: refusals checked before anything is created, and the
frozen reference model sharded like the master.

Under FSDP2 (`fully_shard`, accelerate's `fsdp_version: 2`) the master's parameters are DTensor shards after
`accelerator.prepare`; such a module cannot be deep-copied (FSDP2 forbids it), and a full copy per process would cost
the whole model's memory on every rank. The KL reference of full fine-tuning is therefore copied from the full master
before it is sharded and then sharded the same way (accelerate's `fsdp2_prepare_model`: the same wrap policy and
mixed precision), frozen; its forwards gather one wrapped block at a time like the master's.

`fsdp_refusals` reads the FSDP settings `accelerate launch` passes to its processes (the `ACCELERATE_USE_FSDP` and
`FSDP_*` environment variables that accelerate's own plugin is built from), so a combination the trainer cannot run
is refused before the run directory, the SFT warm-up or the model exist. Nothing here imports accelerate at module
import.
"""

from __future__ import annotations

import copy
import itertools
import os

import torch
from torch import nn

from dllm_ais.families import get_family

LOW_PRECISION_DTYPES = ("bfloat16", "float16")


def fsdp_version_from_env(environ=os.environ) -> int | None:
    """The FSDP version accelerate's processes will use (None: not FSDP), from what `accelerate launch` exported."""
    if environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    return int(environ.get("FSDP_VERSION", "1"))


def fsdp_refusals(preset, fsdp_version: int | None) -> str | None:
    """Why `preset` cannot train under FSDP `fsdp_version` (None = not FSDP), or None when it can.

    FP8/FP4 rollouts need FSDP2 (the quantised copy is refilled from DTensor shards one layer at a time); the Qwen3
    fused rollout copy is synced from full weights only; 16-bit parameters under full fine-tuning would be updated in
    16 bits by a sharded optimizer (load float32 and let FSDP's mixed precision compute in bf16).
    """
    if fsdp_version is None:
        return None
    tc, mc = preset.train, preset.model
    if tc.rollout_precision != "bf16" and fsdp_version != 2:
        return ("FP8/FP4 rollouts under FSDP need FSDP2 (its DTensor shards are gathered one layer at a time into the "
                "quantised copy); set fsdp_version: 2 in accelerate's fsdp_config (--fsdp_version 2), or use "
                "--rollout-precision bf16.")
    if tc.rollout_precision == "fp8" and (why := get_family(mc.family).fsdp_fp8_refusal):
        return why
    if tc.policy_logprob == "trajectory":
        return ("--policy-logprob trajectory under FSDP is not supported (the replay's forward count per rank, "
                "recomputed in backward, differs between ranks); use DDP or --policy-logprob one_step.")
    from dllm_ais.likelihood.policy import POLICY_LIKELIHOODS

    if getattr(POLICY_LIKELIHOODS.get(tc.policy_logprob), "forwards_depend_on_rollout", False):
        return (f"--policy-logprob {tc.policy_logprob} under FSDP is not supported (it skips canvases with nothing to "
                "score, so its forward count per rank differs between ranks); use DDP or --policy-logprob one_step.")
    if tc.lora_r == 0 and mc.dtype in LOW_PRECISION_DTYPES:
        return (f"FSDP full fine-tuning with --dtype {mc.dtype} would update the sharded parameters in 16 bits (small "
                "updates are lost); pass --dtype float32 and set accelerate's mixed_precision: bf16, so that FSDP "
                "keeps fp32 sharded master weights and computes in bf16 (or train LoRA adapters: --lora-r).")
    return None


def check_fsdp(preset) -> None:
    """Raise ValueError with `fsdp_refusals`' reason for the FSDP setup of this launch (a no-op without FSDP)."""
    reason = fsdp_refusals(preset, fsdp_version_from_env())
    if reason is not None:
        raise ValueError(reason)


@torch.no_grad()
def broadcast_from_main(model: nn.Module) -> None:
    """Every process's `model` takes the main process's parameters and buffers (in place). FSDP shards each process's
    own full model, so they must be equal before `fully_shard` and before the FP8 copy and the reference are made
    from them; DDP broadcasts in `prepare`, FSDP2 does not (peft draws LoRA's A from each process's own, randomly
    seeded, global RNG). Collective."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for t in itertools.chain(model.parameters(), model.buffers()):
        x = t.data.view(torch.uint8) if t.dtype == torch.bool else t.data  # gloo has no bool collectives
        dist.broadcast(x, src=0)


def reference_copy(model: nn.Module) -> nn.Module:
    """A frozen deep copy of the (still full, unsharded) master: the KL reference of full fine-tuning."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def shard_reference(accelerator, reference: nn.Module) -> nn.Module:
    """`reference` sharded as accelerator.prepare sharded the master (FSDP2: same plugin, wrap policy and mixed
    precision; no optimizer), frozen. Collective: every process calls it."""
    from accelerate.utils import fsdp2_prepare_model

    return fsdp2_prepare_model(accelerator, reference).eval().requires_grad_(False)
