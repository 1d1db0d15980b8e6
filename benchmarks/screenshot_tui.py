"""Write the README's TUI screenshots, drawn headless by textual:

- docs/img/tui.svg: `phasescope top` over a real recording, the SensorGuard RTX 3090 run in which GPU 0
  trains GPT-2 while GPU 1 idles beside it (../shared/data). Its ticks go through the real LiveState, the
  live classifier and the energy meter, priced at $2.50/GPU-hour and $0.12/kWh.
- docs/img/tui-demo.svg: `phasescope demo` on this machine for --seconds: the host source watching the two
  real PyTorch workloads with the hooks injected, so their rows carry step time, samples/s, MFU, requests/s
  and latency.

    .venv/bin/python benchmarks/screenshot_tui.py [--ticks 150] [--seconds 15] [--no-demo]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.live_helpers

from tests.conftest import shared_data_dir  # noqa: E402
from tests.live_helpers import ticks, training_traces  # noqa: E402

from phasescope.kpi.cost import Prices  # noqa: E402
from phasescope.live.annotate import Annotator  # noqa: E402
from phasescope.live.classify import LiveClassifier  # noqa: E402
from phasescope.live.state import LiveState  # noqa: E402
from phasescope.views.tui import TopApp  # noqa: E402

SIZE = (200, 12)


def screenshot(shared_data: Path, out: Path, ticks_n: int = 150) -> Path:
    traces = training_traces(shared_data)
    start = max(0, int(traces[0].time.searchsorted(traces[0].meta["t_from"])) - 20)
    state = LiveState("replay", prices=Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.12))
    annotate = Annotator(LiveClassifier())
    for batch in ticks(traces, start, start + ticks_n):
        state.ingest(batch)
        annotate(state)
    app = TopApp(state, None)

    async def go() -> str:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            return app.export_screenshot(title="phasescope top")

    svg = asyncio.run(go())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(svg, encoding="utf-8")
    return out


def _export(app: TopApp, size: tuple[int, int]) -> str:
    async def go() -> str:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return app.export_screenshot(title="phasescope demo")

    return asyncio.run(go())


def demo_screenshot(out: Path, seconds: float = 15.0) -> Path:
    from phasescope.cli.demo import DEMO_PRICE_NOTE, DEMO_USD_PER_DEVICE_HOUR
    from phasescope.demo.children import DemoChildren
    from phasescope.live.annotate import HookKpiReader
    from phasescope.live.loop import feed
    from phasescope.sources.host import HostSource

    children = DemoChildren().start(device="cpu")
    try:
        roles = {pid: f"demo {role}" for pid, role in children.pids().items()}
        source = HostSource()
        source.watch(roles)
        # What `phasescope demo` prices with when the config sets no [prices] (and labels as such).
        state = LiveState(source.name, prices=Prices(usd_per_gpu_hour=DEMO_USD_PER_DEVICE_HOUR))
        state.process_labels.update(roles)
        state.note(DEMO_PRICE_NOTE)
        assert children.events_dir is not None
        annotate = Annotator(LiveClassifier(), HookKpiReader(children.events_dir, consume=True))
        stop = threading.Event()
        worker = threading.Thread(target=feed, args=(state, source, 1.0, stop), kwargs={"annotate": annotate})
        worker.start()
        time.sleep(seconds)
        stop.set()
        worker.join(10)
        svg = _export(TopApp(state, None), (200, 10))
    finally:
        children.stop()
    out.write_text(svg, encoding="utf-8")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--no-demo", action="store_true")
    args = ap.parse_args()
    img = REPO / "docs" / "img"
    print(f"wrote {screenshot(shared_data_dir(), img / 'tui.svg', args.ticks)}")
    if not args.no_demo:
        print(f"wrote {demo_screenshot(img / 'tui-demo.svg', args.seconds)}")


if __name__ == "__main__":
    main()
