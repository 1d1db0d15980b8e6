"""The run report (`phasescope run`'s summary) on real hook events: phases in the palette's colours and words.

The events come from real PyTorch workloads on the CPU (an MLP trained for 40 steps, then 40 inference
batches), each in its own hooked process; a short idle gap splits them into training, inference and idle.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from rich.console import Console

from phasescope.instrument.events import load_events
from phasescope.kpi.run_summary import summarize
from phasescope.views.palette import FAVICON, PALETTE
from phasescope.views.run_report import kpi_rows, print_summary, render_html


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    from tests.hook_events import shared_hook_events

    events, _ = shared_hook_events()
    # Gaps over 0.1 ms count as idle: the MLP loads each batch between steps (its data-loader stall is
    # about half the run), so its timeline alternates training and idle.
    out = summarize(load_events(events), idle_gap_s=1e-4)
    phases = {s["phase"] for p in out["processes"] for s in p["segments"]}
    assert phases == {"training", "inference", "idle"}, phases
    out.update(command=["python", "train.py"], exit_code=0, start=0.0, duration_s=1.0)
    return out


def test_the_timeline_bar_draws_each_segment_in_its_palette_colour(doc: dict[str, Any]) -> None:
    page = render_html(doc)
    bar = r"<div data-phase='([^']+)' title='([^']+)' style='width:[0-9.]+%;background:(#[0-9a-f]{6})'"
    bars = re.findall(bar, page)
    assert len(bars) == sum(len(p["segments"]) for p in doc["processes"])
    for phase, title, fill in bars:
        assert fill == PALETTE[phase].fill and title.startswith(PALETTE[phase].name + " ")
    # the old run report's own colours (training blue, inference green) are gone
    assert FAVICON in page.split("</head>")[0]
    assert "#3b7dd8" not in page and "#2ca25f" not in page


def test_the_segment_tables_phase_is_a_palette_badge(doc: dict[str, Any]) -> None:
    page = render_html(doc)
    badges = re.findall(r"<span class='badge' data-phase='([^']+)' style='([^']+)'>([^<]+)</span>", page)
    assert {b[0] for b in badges} == {"training", "inference", "idle"}
    for phase, style, name in badges:
        assert style == PALETTE[phase].css() and name == PALETTE[phase].name
    # every colour on the page is the palette's or one of the page's neutral greys (plotly's own script and
    # its chart template aside: the chart's line is the palette's, checked below)
    neutral = {"#222", "#ccc", "#f3f3f3", "#a60"}
    markup = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    colours = set(re.findall(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b", markup))
    assert colours - neutral <= {p.fill for p in PALETTE.values()} | {p.ink for p in PALETTE.values()}


def test_the_terminal_summary_paints_phases_as_the_tui_does(doc: dict[str, Any]) -> None:
    console = Console(record=True, width=120, color_system="truecolor", force_terminal=True)
    print_summary(doc, console)
    ansi = console.export_text(styles=True)
    painted = {}  # phase -> the (ink, fill) its badge was painted in, as 24-bit ANSI colours
    for m in re.finditer(r"\x1b\[([0-9;]+)m ([a-z ()]+?) \x1b\[0m", ansi):
        codes = m.group(1)
        fg = re.search(r"(?:^|;)38;2;(\d+);(\d+);(\d+)", codes)
        bg = re.search(r"(?:^|;)48;2;(\d+);(\d+);(\d+)", codes)
        if fg and bg:
            ink, fill = ("#" + "".join(f"{int(v):02x}" for v in c.groups()) for c in (fg, bg))
            painted[m.group(2).strip()] = (ink, fill)
    assert set(painted) == {"training", "inference", "idle"}
    for phase, (ink, fill) in painted.items():
        assert (ink, fill) == (PALETTE[phase].ink, PALETTE[phase].fill)


def test_hooks_kpi_rows_name_the_phase(doc: dict[str, Any]) -> None:
    """`phasescope report` shows the same rows (kpi_rows) for its hooks section."""
    rows = [r for p in doc["processes"] for r in kpi_rows(p)]
    assert {r[0] for r in rows} >= {"training", "inference"}
    assert ("training", "steps", "40") in rows


def test_a_training_process_gets_charts_over_time(doc: dict[str, Any]) -> None:
    """Step time, samples/s and the loss (issue 19 item 5), recorded by the injected hooks in a real run."""
    import json

    (train,) = [p for p in doc["processes"] if p["training"]]
    series = train["series"]
    assert len(series["loss"]) == train["training"]["backward_passes"] == 40  # mlp_train.py's 40 steps
    assert all(isinstance(v, float) for v in series["loss"])
    page = render_html(doc)
    assert page.count("<script type='text/javascript'>") == 1  # plotly's JS, inline, once
    div = f'id="series-{train["pid"]}"'
    assert div in page
    new_plot = r'Plotly\.newPlot\(\s*"series-' + str(train["pid"]) + r'",\s*(\[.*?\]),\s*\{'
    figure = re.search(new_plot, page, re.S)
    assert figure is not None
    traces = json.loads(figure.group(1))
    assert [t["name"] for t in traces] == ["step time (s)", "samples/s", "loss"]
    assert traces[2]["y"] == pytest.approx(series["loss"])
    assert {t["line"]["color"] for t in traces} == {PALETTE["training"].fill}
    for p in doc["processes"]:
        if not p["training"]:
            assert p["series"] is None and f'id="series-{p["pid"]}"' not in page


def test_a_run_without_training_has_no_script(doc: dict[str, Any]) -> None:
    only_inference = dict(doc, processes=[p for p in doc["processes"] if not p["training"]])
    assert "<script" not in render_html(only_inference)
