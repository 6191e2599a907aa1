"""Command help that reads well at any terminal width.

Docstrings are wrapped at the source's line length, and Typer's rich help keeps every
line break after the first paragraph, so a paragraph would break mid-sentence on a
wide terminal and twice on a narrow one. ``reflow_help`` joins each prose paragraph into
one line and leaves example blocks (every line indented) as written; Rich then wraps the
prose to the terminal. A docstring's first paragraph is the one line the command list
shows, so it says what the command does.
"""

from __future__ import annotations

import inspect

import typer


def reflow(doc: str) -> str:
    """``doc`` with each prose paragraph on one line; indented blocks kept verbatim."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(_reflow_paragraph(p) for p in paragraphs)


def _reflow_paragraph(paragraph: str) -> str:
    lines = paragraph.splitlines()
    if lines and all(line.startswith("  ") for line in lines):
        return paragraph  # an example block: its line breaks are its meaning
    return " ".join(line.strip() for line in lines)


def reflow_help(app: typer.Typer) -> None:
    """Reflow the help of every command and group under ``app``, before Typer builds
    the click commands from them (at the first call of ``app``)."""
    for command in app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        command.help = reflow(doc) if doc else None
    for group in app.registered_groups:
        reflow_help(group.typer_instance)
