"""The run report as Prefect artifacts on the flow run: the markdown page and a table.

The same page is written as ``report.md`` beside ``report.json`` (``reports.files``); here
it is published so the Prefect UI shows it on the flow run and under Artifacts, keyed
by job so a nightly job's reports line up as one artifact's history.
"""

from __future__ import annotations

import re
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from nightshift.reports.page import report_markdown, report_table


def artifact_key(job: str, kind: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{job}-{kind}".lower()).strip("-")


def publish_report(report: dict[str, Any]) -> None:
    job = report["job"]
    chart = report.get("chart")  # the PNG's URI in the output, when a chart was drawn
    page = report_markdown(report, chart_name=None)
    if chart:
        page += f"\n\nChart: `{chart}`\n"
    create_markdown_artifact(
        markdown=page, key=artifact_key(job, "report"), description=f"{job}: run report"
    )
    create_table_artifact(
        table=report_table(report),
        key=artifact_key(job, "figures"),
        description=f"{job}: tokens, time, throughput and cost of this run",
    )
