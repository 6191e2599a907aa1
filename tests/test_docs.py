"""The docs a newcomer follows: every spec key the code accepts is on docs/spec.md, and
every relative link in README.md and docs/ reaches a file (and a heading, for #anchors)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from nightshift.jobs.spec import JobSpec
from nightshift.jobs.taskspec import ClassifyTask, EmbedTask, ExtractTask, GenerateTask

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field holds directly or in a union (``X | None``,
    ``bool | X``); a model inside a list is a list of values, documented as one key."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (list, dict, tuple):
        return []
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _takes_a_plain_value(annotation) -> bool:
    """Whether a section's key also takes a value that is not a section or null."""
    args = typing.get_args(annotation)
    return any(a is not type(None) and not _models_in(a) for a in args)


def spec_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every dotted key a spec may set inside a section (a section itself, such as
    ``engine``, is documented by its keys; one that may also be a plain value, such as
    ``run.canary: false``, is a key as well)."""
    keys = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        sections = _models_in(field.annotation)
        if not sections or _takes_a_plain_value(field.annotation):
            keys.add(key)
        for section in sections:
            keys |= spec_keys(section, key + ".")
    return keys


def test_every_spec_key_is_on_the_spec_page():
    keys = spec_keys(JobSpec)
    for task in (GenerateTask, ClassifyTask, ExtractTask, EmbedTask):
        keys |= spec_keys(task, "task.")
    assert "run.canary.min_agreement" in keys and "task.labels" in keys  # the walk works
    page = (ROOT / "docs" / "spec.md").read_text()
    missing = sorted(k for k in keys if f"`{k}`" not in page)
    assert missing == [], f"spec keys not on docs/spec.md: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or anchor and anchor not in _anchors(file):
            broken.append(target)
    assert broken == [], f"{page.name}: links that resolve to nothing: {broken}"


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name}" not in readme]
    assert unlinked == []


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Top\n\n[ok](#top) [gone](b.md) [bad anchor](#nowhere)\n")
    (tmp_path / "c.md").write_text("# C\n")
    assert [t for t in _links(page)] == ["#top", "b.md", "#nowhere"]
    assert "top" in _anchors(page) and "nowhere" not in _anchors(page)
