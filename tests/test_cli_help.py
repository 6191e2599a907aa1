"""The command help reads well: a first line saying what each command does, prose that
Rich wraps to the terminal (no hard line breaks inside a paragraph), examples kept."""

from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.cli.helptext import reflow


def _commands(group, prefix: str = "nightshift"):
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(command, "commands"):  # a group (Typer's own click, or click)
            yield from _commands(command, path)
        else:
            yield path, command


COMMANDS = dict(_commands(typer.main.get_command(app)))


def test_every_command_is_seen():
    assert {"nightshift jobs run", "nightshift batch serve", "nightshift cache prune"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_the_first_line_says_what_the_command_does(path):
    first, *_ = COMMANDS[path].help.split("\n\n")
    assert "\n" not in first and first.endswith(".") and len(first) <= 90, first
    assert first.split()[0][0].isupper()  # an imperative verb or a noun, capitalised


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_no_paragraph_breaks_mid_sentence(path):
    command = COMMANDS[path]
    for paragraph in command.help.split("\n\n"):
        lines = paragraph.splitlines()
        assert len(lines) == 1 or all(line.startswith("  ") for line in lines), paragraph
    for param in command.params:
        assert "\n" not in (getattr(param, "help", None) or ""), (path, param.name)


def test_reflow_joins_prose_and_keeps_examples():
    doc = """Do a thing.

    A long paragraph wrapped
    at the source's width.

    Examples:

      nightshift jobs run a.yaml
      nightshift jobs run b.yaml
    """
    assert reflow(doc) == (
        "Do a thing.\n\nA long paragraph wrapped at the source's width.\n\nExamples:"
        "\n\n  nightshift jobs run a.yaml\n  nightshift jobs run b.yaml"
    )


def test_wide_help_keeps_a_paragraph_on_one_line():
    result = CliRunner().invoke(app, ["jobs", "plan", "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0
    line = next(x for x in result.output.splitlines() if "Records, prompt tokens" in x)
    assert "binding limit on that GPU." in line  # the whole paragraph, unbroken
    assert "nightshift jobs plan job.yaml --gpu h100" in result.output
