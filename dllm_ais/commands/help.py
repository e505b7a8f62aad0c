"""`dllm-ais` help and errors: each flag's default in --help (a fixed one, or the preset's read from the default
preset, so help never goes stale), flags moved between help sections, and the preset used without --preset."""

from __future__ import annotations

import argparse

from dllm_ais.commands.field_flags import flags_of
from dllm_ais.presets import get_preset

DEFAULT_PRESET = "tiny-cpu"
"""The preset used when --preset is not given (train, sample, eval)."""


class ShortErrorParser(argparse.ArgumentParser):
    """A parser whose errors are two lines: the error, and where the flags are listed (not the whole usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: see `{self.prog} --help` for the flags.\n")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each flag's default (TRL-style): "(default: X)" after a fixed default; flags that default
    to the preset's value are annotated by `show_preset_defaults`. Help that already names its default is kept."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)"


def _section_of(preset, cls_name: str):
    return {"ModelConfig": preset.model, "SamplerConfig": preset.sampler, "TrainConfig": preset.train,
            "GRPOConfig": preset.grpo, "CorrectionConfig": preset.correction}.get(cls_name)


def show_preset_defaults(parser: argparse.ArgumentParser, command: str) -> None:
    """Append "(default: the preset's; tiny-cpu: X)" to the help of each flag that takes its value from the preset
    (default None and a config field in FIELD_FLAGS), X read from the default preset, so help never goes stale."""
    preset = get_preset(DEFAULT_PRESET)
    fields = flags_of(command)
    for action in parser._actions:
        text = action.help or ""
        if action.default is not None or not action.option_strings or "default" in text.lower():
            continue
        values = []
        for key, flag in fields.items():
            cls_name, _, name = key.partition(".")
            section = _section_of(preset, cls_name)
            if flag in action.option_strings and section is not None and hasattr(section, name):
                values.append(getattr(section, name))
        values = [v for v in values if v is not None and v is not False and v != [] and v != {}]
        if values:
            shown = " ".join(str(v) for v in values)
            action.help = f"{text} (default: the preset's; {DEFAULT_PRESET}: {shown})".lstrip()


def move_to_group(parser: argparse.ArgumentParser, group, dests: tuple[str, ...]) -> None:
    """Show the flags with these dests under `group` in --help (parsing is unchanged): flags that one helper function
    adds together but that belong to different help sections."""
    for action in parser._actions:
        if action.dest not in dests:
            continue
        for other in parser._action_groups:
            if action in other._group_actions and other is not group:
                other._group_actions.remove(action)
        if action not in group._group_actions:
            group._group_actions.append(action)
