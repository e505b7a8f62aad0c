"""Old module paths of 0.1 (before dllm_ais/ was grouped into rl/, train/, analysis/) keep importing for one release.

`import dllm_ais.grpo` (or `from dllm_ais import grpo`, `from dllm_ais.grpo import x`, a `monkeypatch` string) gives the
very module object at its new path, `dllm_ais.rl.grpo`, with a DeprecationWarning naming that path; nothing is copied,
so patching through an old name patches the real module. The package's own code and tests use the new paths only
(tests/test_layout.py checks that). To be removed in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings

MOVED = {
    "advantages": "rl.advantages",
    "correction": "rl.correction",
    "error_tokens": "rl.error_tokens",
    "grpo": "rl.grpo",
    "mismatch_stats": "rl.mismatch_stats",
    "rl_config": "rl.config",
    "backend": "train.backend",
    "distributed": "train.distributed",
    "fsdp_checkpoint": "train.fsdp_checkpoint",
    "fsdp_setup": "train.fsdp_setup",
    "fsdp_sync": "train.fsdp_sync",
    "master_weights": "train.master_weights",
    "rewards": "train.rewards",
    "run_dir": "train.run_dir",
    "sft": "train.sft",
    "train_flags": "train.flags",
    "train_job": "train.job",
    "trainer": "train.trainer",
    "bench_env": "analysis.bench_env",
    "evaluate": "analysis.evaluate",
    "plot": "analysis.plot",
    "study": "analysis.study",
    "study_plan": "analysis.study_plan",
    "study_stats": "analysis.study_stats",
    "variance_cli": "analysis.variance_cli",
}
"""Old module name under dllm_ais -> its new path under dllm_ais."""


class _Alias:
    """Loader that hands out the module at the new path instead of creating one."""

    def __init__(self, new: str):
        self.new = new
        self.target_spec = None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old path is kept for one release (removed in 0.3).",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(self.new)
        self.target_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.target_spec  # the import system stamped the alias spec on it: keep the real one


class MovedFinder:
    """Meta-path finder for the names in MOVED (it answers nothing else)."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        prefix, _, leaf = name.rpartition(".")
        if prefix != "dllm_ais" or leaf not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, _Alias(f"dllm_ais.{MOVED[leaf]}"))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
