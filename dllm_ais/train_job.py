"""Assemble and run a training job from a Preset: task data, model (+ SFT warm-up, LoRA), backend, trainer."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import replace
from pathlib import Path

import torch

from dllm_ais.backend import DiffusionBackend
from dllm_ais.config import Preset
from dllm_ais.run_dir import RunDir
from dllm_ais.trainer import Policy, Trainer

SFT_DIR = "sft"


def task_rows_and_reward(preset: Preset):
    """Training rows and the reward function (the task's, or the user's by import path)."""
    from dllm_ais.tasks.registry import get_task, load_reward_function

    tc = preset.train
    try:
        task = get_task(tc.task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    rows = task.load("train", data_path=tc.data_path, seed=tc.seed, **task_config_kwargs(task.load, tc.task_config))
    if not rows:
        raise ValueError(f"task {tc.task!r} has no training rows (data_path={tc.data_path!r}).")
    reward = load_reward_function(tc.reward_fn) if tc.reward_fn else task.reward
    return task, rows, reward


def task_config_kwargs(fn, options: dict) -> dict:
    """{"config": TaskConfig(**options)} for a task function taking `config=`, {} when there are no options."""
    if not options:
        return {}
    param = inspect.signature(fn).parameters.get("config")
    if param is None or param.default is inspect.Parameter.empty:
        raise ValueError(f"train.task_config={options} given, but {fn.__module__}.{fn.__name__} takes no config.")
    return {"config": type(param.default)(**options)}


def _sft_pairs(task_name: str, n: int, seed: int, options: dict):
    module = importlib.import_module(f"dllm_ais.tasks.{task_name}")
    if not hasattr(module, "sft_pairs"):
        raise ValueError(f"task {task_name!r} has no sft_pairs(); set train.sft_steps=0 or use the arith task.")
    return module.sft_pairs(n, seed=seed, **task_config_kwargs(module.sft_pairs, options))


def build_llada_policy(preset: Preset, run: RunDir, use_chat_template: bool, progress: bool) -> Policy:
    """LLaDA master (from the preset's model, SFT-warmed and cached in <out>/sft when asked), LoRA, backend."""
    from dllm_ais.models.checkpoint import load_llada, save_llada
    from dllm_ais.models.llada import lora_target_regex
    from dllm_ais.models.load import load_model_and_tokenizer, stop_token_ids
    from dllm_ais.sft import warm_up

    tc = preset.train
    model, tokenizer = load_model_and_tokenizer(preset.model)
    if tc.sft_steps > 0:
        cache = run.path / SFT_DIR
        if cache.is_dir():
            model = load_llada(cache, dtype=getattr(torch, preset.model.dtype), device=preset.model.device)
        else:
            pairs = _sft_pairs(tc.task, 20_000, tc.seed, tc.task_config)
            warm_up(model, tokenizer, pairs, tc.sft_steps, tc.sft_batch_size, tc.sft_learning_rate,
                    preset.sampler.gen_length, model.config.mask_token_id, model.config.eos_token_id, tc.seed,
                    progress=progress)
            save_llada(model, cache, tokenizer=tokenizer)
    if tc.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=tc.lora_r, lora_alpha=tc.lora_alpha, lora_dropout=tc.lora_dropout,
                                                 target_modules=lora_target_regex()))
    backend = DiffusionBackend(preset.sampler, model.config.mask_token_id, stop_token_ids(model),
                               p_mask_prompt=tc.p_mask_prompt, mismatch_num_draws=tc.mismatch_num_draws)
    return Policy(model=model, tokenizer=tokenizer, backend=backend, save_model=_save_llada_or_adapter(tokenizer),
                  load_model_state=_load_llada_or_adapter, use_chat_template=use_chat_template)


def _save_llada_or_adapter(tokenizer):
    def save(model, directory: Path) -> None:
        from dllm_ais.models.checkpoint import save_llada

        if hasattr(model, "peft_config"):
            model.save_pretrained(str(directory / "adapter"))
        else:
            save_llada(model, directory / "model", tokenizer=tokenizer)
    return save


def _load_llada_or_adapter(model, directory: Path) -> None:
    from dllm_ais.models.checkpoint import load_llada

    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(directory / "adapter" / "adapter_model.safetensors")))
        return
    loaded = load_llada(directory / "model", dtype=next(model.parameters()).dtype, device="cpu")
    model.load_state_dict(loaded.state_dict())


def run_training(preset: Preset, out: str | Path, resume: bool = False, progress: bool = True,
                 steps: int | None = None) -> Trainer:
    """Create/resume the run in `out` and train to the end; returns the finished Trainer.

    A resumed run uses the configuration saved in `out`; `steps` (if given) extends or shortens it.
    """
    run = RunDir(out)
    if not resume and run.holds_run():
        run.create(preset, resume=False)  # raises the clear "already holds a run" error before any work
    if resume:
        preset = run.create(preset, resume=True)
    if steps is not None:
        preset = replace(preset, train=replace(preset.train, steps=steps))
    task, rows, reward = task_rows_and_reward(preset)  # bad task/data fails before the run dir is touched
    preset = run.create(preset, resume=False) if not resume else run.update_config(preset)
    policy = build_llada_policy(preset, run, task.use_chat_template, progress)
    trainer = Trainer(preset, policy, run, reward, rows, progress=progress)
    if resume:
        trainer.resume()
    trainer.fit()
    return trainer
