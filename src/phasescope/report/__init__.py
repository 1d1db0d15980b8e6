"""`phasescope report`: one self-contained HTML page for a recording or log.

    build(traces, ...) -> ReportData      classify, segment, measure energy and cost (report/data.py)
    render(data) -> str                   the HTML, plotly inline, no network (report/page.py)
"""

from __future__ import annotations

from phasescope.report.data import DeviceReport, ReportData, build
from phasescope.report.page import render

__all__ = ["DeviceReport", "ReportData", "build", "render"]
