"""Masked-diffusion supervised fine-tuning (LLaDA's SFT objective), used for the embedded default's warm-up.

For each sequence draw t ~ U(0, 1), mask every completion token independently with probability p = (1 − ε)t + ε,
and minimise Σ_masked −log p_θ(y_j | masked input) / p, divided by the completion length. EOS padding inside the
completion counts as real tokens (the model learns where to stop), as in LLaDA's SFT.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from dllm_ais.atomic import atomic_file
from dllm_ais.models.shift import logits_view
from dllm_ais.progress import progress_bar
from dllm_ais.train.interrupt import Preempted, install_sigint, resume_command


def sft_loss(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
             mask_token_id: int, generator: torch.Generator, eps: float = 1e-3) -> torch.Tensor:
    """LLaDA SFT loss (Dream: through the shifted view). prompt_ids/prompt_mask [B, P] (left-padded),
    completion_ids [B, L] (EOS-padded)."""
    B, L = completion_ids.shape
    device = completion_ids.device
    t = torch.rand(B, 1, generator=generator, device=device)  # [B, 1]
    p_mask = (1 - eps) * t + eps  # [B, 1]
    masked = torch.rand(B, L, generator=generator, device=device) < p_mask  # [B, L]
    noisy = torch.where(masked, mask_token_id, completion_ids)
    x = torch.cat([prompt_ids, noisy], dim=1)
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(masked)], dim=1)
    view = logits_view(model)  # Dream: position j is read off raw row j − 1 (models/shift.py); LLaDA: the model
    logits = view(input_ids=x, attention_mask=attn, positions=slice(prompt_ids.shape[1], None)).logits  # [B, L, V]
    nll = F.cross_entropy(logits.float().transpose(1, 2), completion_ids, reduction="none")  # [B, L]
    weighted = torch.where(masked, nll / p_mask, 0.0)
    return weighted.sum() / (B * L)


def pad_completions(tokenizer, completions: list[str], length: int, eos_token_id: int) -> torch.Tensor:
    """Tokenise completions, append EOS and pad with EOS to `length` -> [B, length]; errors when one is too long."""
    rows = []
    for text in completions:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_token_id]
        if len(ids) > length:
            raise ValueError(f"SFT completion {text!r} needs {len(ids)} tokens with EOS; raise gen_length above "
                             f"{length}.")
        rows.append(ids + [eos_token_id] * (length - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


@contextmanager
def _stop_at_step_end(resume: str = "--resume"):
    """While active, the first Ctrl-C / SIGTERM / SIGUSR1 sets flag["stop"] to its name (the current step finishes);
    a second Ctrl-C interrupts at once. Outside the main thread signals cannot be handled: the flag never rises."""
    flag = {"stop": None}
    restore = install_sigint(lambda: flag["stop"] is not None, lambda why: flag.__setitem__("stop", why), resume)
    try:
        yield flag
    finally:
        restore(flag["stop"] not in (None, "Ctrl-C"))


def _save_partial(path: Path, model, opt, sched, step: int, gen: torch.Generator, noise: torch.Generator) -> None:
    state = {"step": step, "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "gen": gen.get_state(),
             "noise": noise.get_state()}
    with atomic_file(path) as tmp:
        torch.save(state, tmp)


def warm_up(model, tokenizer, pairs: list[tuple[str, str]], steps: int, batch_size: int, lr: float,
            gen_length: int, loss_fn, eos_token_id: int, seed: int, progress: bool = False,
            checkpoint: str | os.PathLike | None = None, chat: bool = False):
    """SFT on (prompt, completion) pairs: `steps` AdamW updates of `batch_size` pairs each.

    loss_fn(model, prompt_ids, prompt_mask, completion_ids, generator) -> [] (a backend's `sft_loss`).
    checkpoint: a file for an interrupted warm-up. Ctrl-C lets the current step finish, saves model, optimizer,
    schedule and both generators there (atomically) and raises KeyboardInterrupt; a later call with the same file
    continues from that step and gives the weights of an uninterrupted warm-up. The caller deletes it when done.
    chat: wrap prompts in the tokenizer's chat template exactly as the RL rollouts do (the task's use_chat_template),
    so the warm-up teaches the prompt format RL samples from.
    """
    from dllm_ais.models.load import encode_prompts

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    noise = torch.Generator(device=device).manual_seed(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(steps, 1))  # linear decay to 0
    start = 0
    checkpoint = None if checkpoint is None else Path(checkpoint)
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        gen.set_state(state["gen"])
        noise.set_state(state["noise"])
        start = state["step"]
    model.train()
    bar = progress_bar(range(start, steps), enabled=progress, desc="SFT warm-up", unit="step")
    resume = "--resume" if checkpoint is None else resume_command(checkpoint.parent)  # job: <run>/sft-partial.pt
    with _stop_at_step_end(resume) as flag:
        for step in bar:
            if flag["stop"]:
                bar.close()  # ends the progress bar's line: the message starts on its own
                if checkpoint is not None:
                    _save_partial(checkpoint, model, opt, sched, step, gen, noise)
                    print(f"SFT warm-up interrupted after {step}/{steps} steps; saved to {checkpoint}. Continue it "
                          f"with {resume}.", file=sys.stderr)
                else:
                    print(f"SFT warm-up interrupted after {step}/{steps} steps; nothing was saved.", file=sys.stderr)
                if flag["stop"] != "Ctrl-C":
                    raise Preempted(flag["stop"])
                raise KeyboardInterrupt
            _sft_step(model, tokenizer, pairs, batch_size, gen_length, loss_fn, eos_token_id, gen, noise, opt,
                      sched, device, encode_prompts, bar if progress else None, chat)
    opt.zero_grad(set_to_none=True)  # no SFT gradient may leak into the first RL update
    return model.eval()


def _sft_step(model, tokenizer, pairs, batch_size, gen_length, loss_fn, eos_token_id, gen, noise, opt, sched, device,
              encode_prompts, bar, chat: bool = False) -> None:
    """One AdamW update on `batch_size` pairs drawn with `gen`."""
    idx = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
    prompts, completions = zip(*(pairs[i] for i in idx), strict=True)
    ids, mask = encode_prompts(tokenizer, list(prompts), chat=chat, device=device)
    target = pad_completions(tokenizer, list(completions), gen_length, eos_token_id).to(device)
    loss = loss_fn(model, ids, mask, target, noise)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if bar is not None:
        bar.set_postfix(loss=f"{loss.item():.3f}")
