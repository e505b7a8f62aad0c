"""`dllm-ais` help and errors: each flag's default in --help (a fixed one, or the preset's read from the default
preset, so help never goes stale), flags moved between help sections, and the preset used without --preset."""

from __future__ import annotations

import argparse
import sys

from dllm_ais.commands.field_flags import flags_of
from dllm_ais.presets import get_preset

DEFAULT_PRESET = "tiny-cpu"
"""The preset used when --preset is not given (train, sample, eval)."""


class ShortErrorParser(argparse.ArgumentParser):
    """A parser whose errors are two lines: the error, and where the flags are listed (not the whole usage); with
    `brief_help`, its --help shows the common flags and --help-all every flag."""

    brief_dests: frozenset[str] | None = None
    """The flags (by dest) --help shows; None = every flag (set by `brief_help`)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: see `{self.prog} --help` for the flags.\n")

    def format_help(self) -> str:
        if self.brief_dests is None:
            return super().format_help()
        shown = [a for a in self._actions if a.dest in self.brief_dests or isinstance(a, argparse._HelpAction)
                 or isinstance(a, _HelpAll)]
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, shown, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        partial = []
        for group in self._action_groups:
            actions = [a for a in group._group_actions if a in shown]
            if len(actions) < len(group._group_actions):
                partial.append(group.title.split(" (")[0])
            if actions:
                formatter.start_section(group.title)
                formatter.add_arguments(actions)
                formatter.end_section()
        more = len(self._actions) - len(shown)
        formatter.add_text(f"{more} more flags ({', '.join(partial)}): `{self.prog} --help-all`, or docs/commands.md.")
        return formatter.format_help()

    def format_full_help(self) -> str:
        """Every flag (--help-all)."""
        return super().format_help()


class _HelpAll(argparse.Action):
    """--help-all: print every flag and exit (--help shows the common ones)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(parser.format_full_help(), sys.stdout)
        parser.exit()


def brief_help(parser: ShortErrorParser, dests: tuple[str, ...]) -> None:
    """--help shows only the flags with these dests (and says how many more there are); --help-all shows all."""
    unknown = set(dests) - {a.dest for a in parser._actions}
    if unknown:  # a renamed flag must not silently drop out of --help
        raise ValueError(f"brief_help({parser.prog}): no flags with dest {sorted(unknown)}")
    parser.add_argument("--help-all", action=_HelpAll, help="show every flag and exit")
    parser.brief_dests = frozenset(dests)


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
            "PolicyLikelihoodConfig": preset.train.likelihood, "GRPOConfig": preset.grpo,
            "CorrectionConfig": preset.correction}.get(cls_name)


def _shown(action: argparse.Action, value):
    """How help shows a preset's value: an on/off flag's bool as on / off; None where there is nothing to show."""
    if isinstance(value, bool) and action.choices is not None and set(action.choices) == {"on", "off"}:
        return "on" if value else "off"
    return None if value is None or value is False or value == [] or value == {} else value


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
                values.append(_shown(action, getattr(section, name)))
        values = [v for v in values if v is not None]
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
