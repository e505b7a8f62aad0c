"""The trained models of the evidence ladder's rung 2 (issue 40): tiny LLaDA, Dream and SDAR models trained on the
digits task by the package's own SFT warm-up and GRPO trainer, one model per completion length L, two checkpoints each.

Task: `digits` with op shift and L/2 digits (DigitsConfig.length = L/2), so a completion of L tokens is the L/2-digit
answer, EOS, and EOS padding — LLaDA's fixed-length canvas, half answer, half padding, at every L. Prompts go in
without the chat template (the raw "<digits>>" string: every forward of rung 2 pays for the prompt's tokens).
Model: a 2-layer, width-`d_model` model of the family (LLaDA: models/tiny.tiny_model; Dream:
tiny_dream_model; SDAR: models/sdar/tiny.tiny_sdar_model, 2 KV heads) drawn from `seed`, saved as a checkpoint
directory and loaded by the trainer like any --model.
Checkpoints: `sft` = after the package's masked-diffusion SFT warm-up (train/sft.py `warm_up`, run in chunks until
the held-out reward of a T = 1 sample reaches `sft_target`: comparable starting points at every L and family),
`rl` = after `rl_steps` GRPO steps of the package's Trainer from it (one_step likelihood — SDAR: its block-wise ELBO
—, BF16 rollouts, bypass: no mismatch to correct). Sampler of the RL steps: one block, steps = L, T = 1 (LLaDA
low-confidence; Dream the `alg` of the model's sampling defaults; SDAR blocks of 4, low_confidence_dynamic, τ 0.9).
Everything is deterministic from the seed (explicit generators everywhere in the trainer); the models are cached
under `root` (default runs/ladder, gitignored) in a folder named by the settings' hash, so a changed setting
retrains. Building them is part of the ladder's command, not of rung 2's timed budget (its cost is printed).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

FAMILIES = ("llada", "dream", "sdar")
CHECKPOINTS = ("sft", "rl")


@dataclass(frozen=True)
class LadderModelConfig:
    """Size and training recipe of the rung-2 models (the defaults: the committed run)."""

    d_model: int = 32
    """Width (LLaDA d_model / Dream hidden_size); 2 heads of d_model / 2."""
    n_layers: int = 2
    """Transformer blocks (issue 40 asks for 2–4)."""
    mlp: int = 64
    """MLP hidden width."""
    sft_target: float = 0.5
    """SFT runs in chunks until the mean held-out reward of one T = 1 sample per prompt reaches this: the `sft`
    checkpoint (a model that is right about half the time, so GRPO's groups disagree)."""
    sft_chunk: int = 10
    """SFT steps per chunk (each a `train.sft.warm_up` call: batch 64, lr `sft_lr` decaying linearly to 0 within the
    chunk, seed + steps so far)."""
    sft_max_steps: int = 1500
    """Stop SFT here even below the target."""
    sft_lr: float = 3e-3
    """SFT learning rate."""
    eval_prompts: int = 128
    """Held-out prompts of the reward check."""
    rl_steps: int = 20
    """GRPO steps after the warm-up: the `rl` checkpoint."""
    rl_lr: float = 5e-4
    """GRPO learning rate (AdamW)."""
    prompts_per_step: int = 8
    """Prompts per GRPO step (each sampled G = 8 times)."""
    dream_alg: str = "entropy"
    """Dream's sampling rule during the RL steps (Dream's README uses entropy)."""
    seed: int = 0
    """Seeds the initial weights, the data order and every draw of the trainer."""

    def __post_init__(self):
        if self.d_model % 16 or self.mlp % 16:
            raise ValueError(f"LadderModelConfig: d_model={self.d_model} and mlp={self.mlp} must be multiples of 16.")
        if not 2 <= self.n_layers <= 4:
            raise ValueError(f"LadderModelConfig.n_layers={self.n_layers}: issue 40 asks for 2-4 layers.")
        if self.sft_chunk < 1 or self.sft_max_steps < self.sft_chunk or self.rl_steps < 1:
            raise ValueError("LadderModelConfig: sft_chunk >= 1, sft_max_steps >= sft_chunk and rl_steps >= 1.")


def digits_length(L: int) -> int:
    """Digits per problem at completion length L (L/2: the answer, then EOS and padding)."""
    if L % 2 or not 4 <= L <= 64:
        raise ValueError(f"completion length L={L}: use an even L in 4..64 (the digits task holds 2..32 digits).")
    return L // 2


SIZES = {"llada": lambda c: {"d_model": c.d_model, "n_layers": c.n_layers, "n_heads": 2, "mlp_hidden_size": c.mlp},
         "dream": lambda c: {"hidden_size": c.d_model, "num_hidden_layers": c.n_layers, "num_attention_heads": 2,
                             "num_key_value_heads": 2, "intermediate_size": c.mlp},
         "sdar": lambda c: {"hidden_size": c.d_model, "num_hidden_layers": c.n_layers, "num_attention_heads": 2,
                            "num_key_value_heads": 2, "head_dim": c.d_model // 2, "intermediate_size": c.mlp}}
"""Family -> the keyword arguments of its tiny model (the family record's `tiny` hook) at cfg's size."""

BLOCK_LENGTH = {"sdar": 4}
"""Sampler block length of a family that is trained in blocks (SDAR: its released models' 4, mc_sdar.RUNG2_BLOCK);
the others sample one block of L."""
RL_LIKELIHOOD = {"sdar": "elbo"}
"""--policy-logprob of the RL steps where the family refuses one_step (SDAR: its block-wise ELBO, K = 2 draws, the
package default); the others train with one_step."""


def initial_model(family: str, cfg: LadderModelConfig):
    """The untrained model of `family` (fp32, eval mode), weights drawn from cfg.seed."""
    from dllm_ais.families import get_family

    if family not in SIZES:
        raise ValueError(f"family={family!r}: use one of {', '.join(FAMILIES)}.")
    return get_family(family).tiny(seed=cfg.seed, **SIZES[family](cfg))


def preset(family: str, L: int, cfg: LadderModelConfig, init_dir: Path):
    """The trainer's Preset of one model: digits shift with L/2 digits, one block (SDAR: blocks of 4, its default
    low_confidence_dynamic strategy, τ 0.9), steps = L, T = 1 (a family with named position rules, Dream, samples
    with `cfg.dream_alg`); RL with one_step (SDAR: its block-wise ELBO, `RL_LIKELIHOOD`)."""
    from dllm_ais.config import ModelConfig, Preset, SamplerConfig, TrainConfig
    from dllm_ais.families import get_family
    from dllm_ais.rl.config import CorrectionConfig, GRPOConfig

    rule = cfg.dream_alg if get_family(family).position_rules else None
    return Preset(
        f"ladder-{family}-L{L}", "rung-2 model of the estimator ladder (dllm_ais/analysis/ladder_models.py)",
        ModelConfig(family=family, path=str(init_dir)),
        SamplerConfig(gen_length=L, block_length=BLOCK_LENGTH.get(family, L), steps=L, temperature=1.0,
                      dream_alg=rule, dream_alg_temp=None if rule is None else 0.0),
        TrainConfig(task="digits", task_config={"op": "shift", "length": digits_length(L)}, steps=cfg.rl_steps,
                    policy_logprob=RL_LIKELIHOOD.get(family, "one_step"),
                    prompts_per_step=cfg.prompts_per_step, learning_rate=cfg.rl_lr, sft_steps=0,
                    rollout_precision="bf16", seed=cfg.seed, save_every_minutes=0.0, keep_checkpoints=1),
        GRPOConfig(num_generations=8, scale_rewards="group", epsilon=0.2, beta=0.0, loss_type="dapo",
                   max_completion_length=L, num_iterations=1),
        CorrectionConfig(correction="none", bypass=True))


def _key(family: str, L: int, cfg: LadderModelConfig) -> str:
    blob = json.dumps({"family": family, "L": L, **asdict(cfg), "version": 1}, sort_keys=True)
    return f"{family}-L{L}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def _reward(backend, model, tok, rows: list[dict], seed: int) -> float:
    """Mean digits reward of one T = 1 sample per row (the family's sampler, no chat template)."""
    from dllm_ais.models.load import encode_prompts
    from dllm_ais.tasks import digits

    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], chat=False)
    with torch.no_grad():
        ro = backend.sample(model, ids, mask, torch.Generator().manual_seed(seed))
    texts = [tok.decode(c[k], skip_special_tokens=True) for c, k in zip(ro.completion_ids, ro.completion_mask,
                                                                         strict=True)]
    return sum(digits.score(t, r["answer"]) for t, r in zip(texts, rows, strict=True)) / len(rows)


def _train(family: str, L: int, cfg: LadderModelConfig, folder: Path, log) -> None:
    """Initial checkpoint, SFT to the target reward, RL steps with the package's trainer (no chat template);
    writes folder/{init, sft, rl, train.json}."""
    from accelerate import PartialState

    from dllm_ais.families import get_family as family_of
    from dllm_ais.models.tiny import tiny_tokenizer
    from dllm_ais.tasks import digits
    from dllm_ais.train.job import build_policy, task_rows_and_reward
    from dllm_ais.train.run_dir import RunDir
    from dllm_ais.train.sft import warm_up
    from dllm_ais.train.trainer import Trainer

    t0, c0 = time.perf_counter(), time.process_time()
    fam, tok = family_of(family), tiny_tokenizer()
    model = initial_model(family, cfg)
    p = preset(family, L, cfg, folder / "init")
    fam.save(model, tok, folder / "init")
    backend = fam.backend(p.sampler, model, tok, p.train)
    dc = digits.DigitsConfig(op="shift", length=digits_length(L))
    pairs = digits.sft_pairs(20_000, seed=cfg.seed, config=dc)
    held = digits.load("test", limit=cfg.eval_prompts, seed=cfg.seed + 1, config=dc)
    steps, curve = 0, []
    while steps < cfg.sft_max_steps:  # SFT in chunks until the sampled reward reaches the target
        warm_up(model, tok, pairs, cfg.sft_chunk, 64, cfg.sft_lr, L, backend.sft_loss, tok.eos_token_id,
                cfg.seed + steps, chat=False)
        steps += cfg.sft_chunk
        curve.append((steps, _reward(backend, model, tok, held, cfg.seed + steps)))
        if curve[-1][1] >= cfg.sft_target:
            break
    fam.save(model, tok, folder / "sft")
    t_sft = time.perf_counter() - t0
    p = replace(p, model=replace(p.model, path=str(folder / "sft")))
    PartialState(cpu=True)
    run = RunDir(folder / "run")
    p = run.create(p, resume=False)
    _, rows, reward = task_rows_and_reward(p)
    policy = build_policy(p, run, use_chat_template=False, progress=False)
    trainer = Trainer(p, policy, run, reward, rows, progress=False)
    trainer.fit()
    fam.save(trainer.master, tok, folder / "rl")
    from dllm_ais import metrics as M

    rewards = [r.get(M.REWARD_MEAN) for r in sorted(M.read_metrics(run.path), key=lambda r: r[M.STEP])]
    info = {"family": family, "L": L, "config": asdict(cfg), "sft_steps": steps, "sft_curve": curve,
            "sft_seconds": t_sft, "rl_seconds": time.perf_counter() - t0 - t_sft,
            "cpu_seconds": time.process_time() - c0, "rl_rewards": rewards,
            "held_out_reward": {"sft": curve[-1][1], "rl": _reward(backend, trainer.master, tok, held, cfg.seed)}}
    (folder / "train.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"trained {family} L={L}: SFT {steps} steps ({t_sft:.0f} s, reward {curve[-1][1]:.3f}), RL "
        f"{info['rl_seconds']:.0f} s (reward {info['held_out_reward']['rl']:.3f})")


def checkpoints(family: str, L: int, cfg: LadderModelConfig, root: Path = Path("runs/ladder"), log=print
                ) -> dict[str, Path]:
    """{checkpoint name: directory} of the (cached or freshly trained) model of `family` at length L."""
    folder = root / _key(family, L, cfg)
    if not (folder / "train.json").is_file():
        if folder.exists():
            import shutil

            shutil.rmtree(folder)  # an interrupted build: start again
        folder.mkdir(parents=True)
        _train(family, L, cfg, folder, log)
    return {name: folder / name for name in CHECKPOINTS}


def load(family: str, directory: Path):
    """The checkpoint in `directory` as an fp32 eval-mode model (the family's own loader)."""
    from dllm_ais.families import get_family as family_of

    return family_of(family).load_dir(directory, dtype=torch.float32, device="cpu").eval()


def train_info(directory: Path) -> dict:
    """train.json of the model whose checkpoint is `directory`."""
    return json.loads((directory.parent / "train.json").read_text())
