"""The report's ``quality`` section for people: the table rows, the confusion matrix,
the headline's and the summary's words. Built from the report dict alone, like the page;
a report without ``quality`` (no ``eval`` in the spec) shows none of it."""

from __future__ import annotations

from typing import Any

from nightshift.intervals import describe
from nightshift.reports.format import Section, count, percent, usd

NOTE = (
    "Over every committed record with a label, whichever run answered it. Accuracy counts "
    "the answered ones; failed and rejected records show in coverage; records without a "
    "label are counted apart."
)


def _share(value: float | None) -> str:
    return "n/a" if value is None else percent(value)


def _with_ci(q: dict[str, Any], name: str) -> str:
    """A share and its 95% interval: "54.4% (95% CI 49.5-59.3%)"."""
    interval = describe(q.get(f"{name}_ci"))
    return _share(q.get(name)) + (f" ({interval})" if interval else "")


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def quality_section(report: dict[str, Any]) -> Section | None:
    q = report.get("quality")
    if not q:
        return None
    if q.get("error"):
        return Section("Quality", f"Could not score {q.get('key', 'eval')}: {q['error']}")
    section = Section("Quality", f"{NOTE} True values: column {q['column']!r} ({q['source']}).")
    kind = q["kind"]
    if kind == "classify":
        section.add("accuracy", _with_ci(q, "accuracy"), "of answered labelled records")
        section.add("macro F1", _score(q["macro_f1"]))
    elif kind == "extract":
        section.add("valid JSON", _share(q["valid_json_rate"]), "of answers given")
        section.add("exact match (whole answer)", _with_ci(q, "exact_match_rate"), "of answered")
        for name, field in q["per_field"].items():
            section.add(f"field {name}: exact match", _with_ci(field, "exact_match_rate"))
    else:
        section.add("exact match", _with_ci(q, "exact_match_rate"), "of answered")
        section.add("chrF", "n/a" if q["chrf"] is None else f"{q['chrf']:.1f}", "0 to 100")
    r = q["records"]
    section.add("correct", count(q["correct"]), "records")
    section.add("coverage", _share(q["coverage"]), "answered of labelled")
    section.add(
        "correct of all labelled",
        _with_ci(q, "accuracy_of_labelled"),
        "failed and rejected records counted as not correct",
    )
    for name in ("labelled", "answered", "failed", "rejected", "unlabelled"):
        section.add(f"records {name}", count(r[name]), "records")
    if q.get("usd_per_1000_correct") is not None:
        section.add("cost per 1,000 correct answers", usd(q["usd_per_1000_correct"]), "USD")
    return section


def confusion_lines(report: dict[str, Any]) -> list[str]:
    """classify: the confusion matrix (rows true, columns predicted) and each label's
    precision, recall and F1, as markdown."""
    q = report.get("quality") or {}
    if q.get("kind") != "classify" or q.get("error") or not q.get("confusion"):
        return []
    labels, matrix = q["confusion"]["labels"], q["confusion"]["matrix"]
    lines = [
        "### Confusion matrix",
        "",
        "Rows: the true label; columns: the answer.",
        "",
        "| true \\ answer | " + " | ".join(_cell(label) for label in labels) + " |",
        "| --- |" + " ---: |" * len(labels),
    ]
    for label, row in zip(labels, matrix, strict=True):
        lines.append(f"| {_cell(label)} | " + " | ".join(count(n) for n in row) + " |")
    lines += [
        "",
        "| label | precision (95% CI) | recall (95% CI) | F1 | support |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, m in q["per_label"].items():
        lines.append(
            f"| {_cell(label)} | {_score(m['precision'])}{_bounds(m.get('precision_ci'))} | "
            f"{_score(m['recall'])}{_bounds(m.get('recall_ci'))} | "
            f"{_score(m['f1'])} | {count(m['support'])} |"
        )
    return lines


def _bounds(interval: list[float] | tuple[float, float] | None) -> str:
    return "" if not interval else f" ({interval[0]:.3f}-{interval[1]:.3f})"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def headline_figure(q: dict[str, Any]) -> str | None:
    """The task's one quality figure in words: "accuracy 61.2%", "exact match 40.0%"."""
    if not q or q.get("error"):
        return None
    if q["kind"] == "classify":
        return f"accuracy {_with_ci(q, 'accuracy')} of {count(q['records']['answered'])} answered"
    if q["kind"] == "extract":
        return (
            f"valid JSON {_share(q['valid_json_rate'])}, exact match "
            f"{_with_ci(q, 'exact_match_rate')} of {count(q['records']['answered'])} answered"
        )
    chrf = "n/a" if q["chrf"] is None else f"{q['chrf']:.1f}"
    return (
        f"exact match {_with_ci(q, 'exact_match_rate')}, chrF {chrf} of "
        f"{count(q['records']['answered'])} answered"
    )


def _per_correct(q: dict[str, Any]) -> str:
    per = q.get("usd_per_1000_correct")
    return "" if per is None else f"; {usd(per)} per 1,000 correct answers"


def quality_headline(report: dict[str, Any]) -> str:
    """A sentence for the page's headline, or "" without quality."""
    q = report.get("quality") or {}
    figure = headline_figure(q)
    return f" Quality: {figure}{_per_correct(q)}." if figure else ""


def quality_summary_lines(report: dict[str, Any], cost: bool = True) -> list[str]:
    """The summary line ``jobs run`` prints, beside the cost line (``cost``: with this
    run's cost in it)."""
    q = report.get("quality")
    if not q:
        return []
    if q.get("error"):
        return [f"quality: not scored ({q['error']})"]
    r = q["records"]
    line = f"quality: {headline_figure(q)} (coverage {_share(q['coverage'])}"
    if r["unlabelled"]:
        line += f", {count(r['unlabelled'])} unlabelled apart"
    line += ")"
    if cost:
        line += f"; cost ${report['cost']['usd_total']:.4f}"
    return [line + _per_correct(q)]


def quality_table_lines(quality: dict[str, Any]) -> list[str]:
    """The quality figures as text lines (``jobs eval``): the section's rows, then the
    confusion matrix of a classify job."""
    section = quality_section({"quality": quality})
    if section is None:
        return []
    lines = [section.note, ""]
    lines += [f"{row['metric']}: {row['value']} {row['unit']}".rstrip() for row in section.rows]
    matrix = confusion_lines({"quality": quality})
    return lines + (["", *matrix] if matrix else [])
