"""The report's files in the output: report.png, report.md, then report.json last."""

from __future__ import annotations

import json
from typing import Any

from nightshift.io.outputs import REPORT_CHART, REPORT_FILE, REPORT_PAGE, JobOutput
from nightshift.reports.chart import chart_png_bytes
from nightshift.reports.page import report_markdown


def write_report_files(output: JobOutput, report: dict[str, Any]) -> None:
    """report.png (when there is a timeline), report.md, then report.json, which
    names the other two (``report["chart"]``, ``report["report"]``)."""
    store = output.store
    chart = chart_png_bytes(report)
    if chart:
        store.put_bytes(REPORT_CHART, chart)
        report["chart"] = store.uri(REPORT_CHART)
    report["report"] = store.uri(REPORT_FILE)
    page = report_markdown(report, chart_name=REPORT_CHART if chart else None)
    store.put_bytes(REPORT_PAGE, page.encode())
    store.put_bytes(REPORT_FILE, (json.dumps(report, indent=2) + "\n").encode())
