"""Reward functions called exactly as TRL's GRPOTrainer calls them, several at once, with TRL's `None` semantics.

TRL (1.16, `GRPOTrainer._calculate_rewards`) calls every reward function with keyword arguments only:
`fn(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=..., log_extra=..., log_metric=...)`,
where `columns` are the dataset columns except `prompt`/`completion`/`completion_ids`, each a list aligned with the
completions (one entry per generation). For conversational data prompts are message lists
(`[{"role": "user", "content": ...}]`) and completions are `[{"role": "assistant", "content": text}]`; otherwise
both are strings. TRL decides by the dataset's prompt format (`trl.data_utils.is_conversational`: the example's
`prompt` is a list of role/content messages); here the task's prompt is text that the policy wraps in the tokenizer's
chat template as one user turn, which is what a conversational dataset row is for the model, so the rule is
`conversational_form`: conversational iff the rows' prompts are message lists or the policy applies a chat template.
A function returns one value per completion; `None` (or NaN) means "not applicable to this sample": it is ignored,
and the total is the weighted `nansum` over functions (a sample no function scored gets 0, as in TRL). An
exception, a wrong count or an infinite value makes the step unusable (`StepSkipped`); `RewardSet.record` turns
`max_consecutive_failures` such steps in a row into a `RewardFailure` that stops training with the last error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_CONSECUTIVE_FAILURES = 3
"""Consecutive steps whose rewards could not be computed before training stops with an error."""
EXCLUDED_COLUMNS = ("prompt", "completion", "completion_ids")
"""Row keys TRL does not pass as columns."""


class StepSkipped(Exception):
    """A step that could not be used (reward error); reported and counted, training goes on."""


class RewardFailure(RuntimeError):
    """Rewards failed on too many consecutive steps: training stops (the CLI exits 2 with this message)."""


@dataclass(frozen=True)
class TrainerState:
    """What `trainer_state=` gives a reward function (the fields of transformers' TrainerState that make sense here)."""

    global_step: int
    """Steps completed before this one (0 on the first step)."""
    max_steps: int
    """Total GRPO steps of the run."""


def reward_name(fn: Callable) -> str:
    """A function's name as TRL shows it (`__name__`), for metrics and errors."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def is_conversational(example: dict) -> bool:
    """TRL's rule (`trl.data_utils.is_conversational`): a dataset row is conversational when one of its
    prompt/completion/messages fields is a list of messages (dicts with `role` and `content`)."""
    for key in ("prompt", "chosen", "rejected", "completion", "messages"):
        value = example.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict) and "role" in value[0] \
                and "content" in value[0]:
            return True
    return False


def conversational_form(rows: Sequence[dict], chat_template_applied: bool) -> bool:
    """Whether reward functions get TRL's conversational form: the rows are conversational (TRL's rule) or the
    policy wrapped the text prompts in the tokenizer's chat template (a one-turn conversation for the model)."""
    return chat_template_applied or bool(rows) and is_conversational(rows[0])


def as_messages(prompts: Sequence[Any], completions: Sequence[str]) -> tuple[list, list]:
    """Plain texts -> TRL's conversational form: one user message per text prompt (message lists are kept), one
    assistant message per completion."""
    return ([p if isinstance(p, list) else [{"role": "user", "content": p}] for p in prompts],
            [[{"role": "assistant", "content": c}] for c in completions])


def call_reward_function(fn: Callable, prompts: list, completions: list, completion_ids: list[list[int]],
                         columns: dict[str, list], trainer_state: TrainerState | None) -> torch.Tensor:
    """One TRL-style call -> float32 [N] with NaN where the function returned None. Raises StepSkipped naming `fn`."""
    name = reward_name(fn)
    try:
        values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns,
                    trainer_state=trainer_state, log_extra=_ignore, log_metric=_ignore)
        out = torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)
    except Exception as e:  # user code: report, the caller decides whether to stop
        raise StepSkipped(f"reward function {name} raised {type(e).__name__}: {e}") from e
    if out.shape != (len(completions),):
        raise StepSkipped(f"reward function {name} returned {out.numel()} values for {len(completions)} completions.")
    if torch.isinf(out).any():
        raise StepSkipped(f"reward function {name} returned inf.")
    return out


def _ignore(*args, **kwargs) -> None:
    """Stand-in for TRL's log_extra / log_metric hooks (completion tables and extra scalars are not logged here)."""


@dataclass
class RewardOutput:
    """Rewards of one step."""

    total: torch.Tensor
    """[N] float32: weighted nansum over functions (TRL's combination)."""
    per_function: dict[str, float] = field(default_factory=dict)
    """Mean over the samples each function scored (NaN if it scored none), keyed by function name."""


@dataclass
class RewardSet:
    """The reward functions of a run, their weights, and the count of consecutive failed steps."""

    functions: list[Callable]
    """TRL-style reward functions."""
    weights: list[float] | None = None
    """One weight per function (None: all 1.0, as TRL's reward_weights default)."""
    max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES
    """Failed steps in a row before `record` raises RewardFailure."""
    consecutive_failures: int = 0
    """Failed steps since the last successful one."""

    def __post_init__(self):
        if not self.functions:
            raise ValueError("no reward function given.")
        if self.weights is None:
            self.weights = [1.0] * len(self.functions)
        if len(self.weights) != len(self.functions):
            raise ValueError(f"--reward-weights has {len(self.weights)} value(s) for {len(self.functions)} reward "
                             "function(s); give one weight per --reward-fn.")
        if self.max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures={self.max_consecutive_failures} must be >= 1.")

    def __call__(self, prompts: list[str], completions: list[str], rows: list[dict], *,
                 completion_ids: list[list[int]] | None = None, trainer_state: TrainerState | None = None,
                 conversational: bool = False) -> RewardOutput:
        """Score `completions` (plain texts) of `prompts` (plain texts) with every function; `rows` give the columns."""
        from dllm_ais.tasks.base import reward_columns

        columns = reward_columns(rows, EXCLUDED_COLUMNS)
        if conversational:
            prompts, completions = as_messages(prompts, completions)
        if completion_ids is None:
            completion_ids = [[] for _ in completions]
        per_fn = torch.stack([call_reward_function(fn, prompts, completions, completion_ids, columns, trainer_state)
                              for fn in self.functions], dim=1)  # [N, F]
        weights = torch.tensor(self.weights, dtype=torch.float32)  # [F]
        total = (per_fn * weights).nansum(dim=1)  # [N]
        scored = ~per_fn.isnan()  # [N, F]
        means = per_fn.nan_to_num(0.0).sum(0) / scored.sum(0)  # [F], NaN where a function scored nothing
        return RewardOutput(total, {reward_name(fn): float(m) for fn, m in zip(self.functions, means, strict=True)})

    def record(self, failed: bool, error: Exception | None = None) -> None:
        """Count a step's outcome; after `max_consecutive_failures` failures in a row raise RewardFailure."""
        self.consecutive_failures = self.consecutive_failures + 1 if failed else 0
        if self.consecutive_failures >= self.max_consecutive_failures:
            raise RewardFailure(f"rewards failed on {self.consecutive_failures} consecutive steps; stopping. Last "
                                f"error: {error}. Check --reward-fn against the TRL calling convention (keyword "
                                "arguments prompts=, completions=, completion_ids=, dataset columns, **kwargs).")


def compute_rewards(reward_fns: RewardSet | Callable, prompts: list[str], completions: list[str], rows: list[dict],
                    **kwargs: Any) -> torch.Tensor:
    """Total reward [N] of one or several TRL-style functions (a bare callable is a set of one)."""
    rewards = reward_fns if isinstance(reward_fns, RewardSet) else RewardSet([reward_fns])
    return rewards(prompts, completions, rows, **kwargs).total


def load_reward_set(paths: str | Sequence[str] | None, weights: Sequence[float] | None, default: Callable,
                    ) -> RewardSet:
    """Reward functions from import paths ('pkg.module:function'; None/empty: `default`, the task's reward)."""
    from dllm_ais.tasks.registry import load_reward_function

    if isinstance(paths, str):
        paths = [paths]
    functions = [load_reward_function(p) for p in paths] if paths else [default]
    return RewardSet(functions, list(weights) if weights is not None else None)
