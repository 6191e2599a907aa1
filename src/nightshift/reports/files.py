"""The report's files in the output: report.png, report.md, then report.json last.

report.png costs about 1.5 s of CPU at a run's wrap-up (importing matplotlib, then
drawing), whatever the run's size. ``NIGHTSHIFT_REPORT_CHART=0`` skips it: report.md
then names no chart. The test suite sets it for its hundreds of small runs, and turns
it back on where a test checks the chart."""

from __future__ import annotations

import json
import os
from typing import Any

from nightshift.io.outputs import REPORT_CHART, REPORT_FILE, REPORT_PAGE, JobOutput
from nightshift.reports.page import report_markdown

CHART_SETTING = "NIGHTSHIFT_REPORT_CHART"


def chart_wanted() -> bool:
    """Whether runs write report.png: unless ``NIGHTSHIFT_REPORT_CHART`` is 0, false,
    no or off."""
    return os.environ.get(CHART_SETTING, "1").strip().lower() not in ("0", "false", "no", "off")


def write_report_files(output: JobOutput, report: dict[str, Any]) -> None:
    """report.png (when there is a timeline), report.md, then report.json, which
    names the other two (``report["chart"]``, ``report["report"]``)."""
    store = output.store
    wanted = chart_wanted()
    chart = _chart(report) if wanted else None
    if not wanted and store.exists(REPORT_CHART):  # else beside a report naming none
        store.delete([REPORT_CHART])
    if chart:
        store.put_bytes(REPORT_CHART, chart)
        report["chart"] = store.uri(REPORT_CHART)
    report["report"] = store.uri(REPORT_FILE)
    page = report_markdown(report, chart_name=REPORT_CHART if chart else None)
    store.put_bytes(REPORT_PAGE, page.encode())
    store.put_bytes(REPORT_FILE, (json.dumps(report, indent=2) + "\n").encode())


def _chart(report: dict[str, Any]) -> bytes | None:
    from nightshift.reports.chart import chart_png_bytes  # matplotlib: only when drawn

    return chart_png_bytes(report)
