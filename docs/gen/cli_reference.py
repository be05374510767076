"""The CLI reference: every ``icegate-maintain`` command and option, read from its parser.

The parser is the one the command runs with
(:func:`icegate_dagster.cli.parser.build_parser`), so the reference says what ``--help``
says, laid out as pages.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from docs.gen.markdown import table
from icegate_dagster.cli.parser import build_parser


def subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each subcommand: its name, its one-line help and its parser, in the parser's order."""
    for action in parser._actions:  # argparse has no public way to list subcommands
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    # argparse fills %(default)s and the like when it prints help; so does the reference.
    return text % {**vars(action), "prog": ""} if "%(" in text else text


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:  # a flag: store_true and the like
        return ""
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return f"`{metavar}`"


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS):
        return "required" if action.required else ""
    return f"`{action.default}`"


def options_table(parser: argparse.ArgumentParser) -> list[str]:
    """The options of one command as a Markdown table (``--help`` left out)."""
    rows: list[list[str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
        repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
        help_text = _help(action)
        if repeat and "repeatable" in help_text:
            repeat = ""
        rows.append([flags, _argument(action), _default(action), help_text + repeat])
    return table(["option", "value", "default", "what it does"], rows)


def _sentence(text: str) -> str:
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage:").split())


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference: the command's synopsis and exit codes, then one section per command."""
    parser = parser or build_parser()
    lines = [
        parser.description or "",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        _sentence(parser.epilog or ""),
        "",
    ]
    for name, summary, sub in subcommands(parser):
        lines += [f"### `{name}`", "", _sentence(summary), ""]
        if sub.description:
            lines += [sub.description, ""]
        lines += ["```text", _usage(sub), "```", "", *options_table(sub)]
    return "\n".join(lines)
