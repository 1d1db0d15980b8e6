"""Stand-in for `phasescope serve --source replay:...` while that command is being written: exposes the
replayed devices' signals under the agent's metric names on /metrics. Test use only."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from phasescope.prom.names import SIGNAL_METRICS
from phasescope.schema import SIGNAL_NAMES
from phasescope.sources.open import open_source


class ReplayCollector(Collector):
    def __init__(self, spec: str) -> None:
        self.source = open_source(spec)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        batch = self.source.read()
        for j, sig in enumerate(SIGNAL_NAMES):
            m = SIGNAL_METRICS[sig]
            if m.kind != "gauge":
                continue
            fam = GaugeMetricFamily(m.name, m.help, labels=["uuid", "gpu", "model", "host"])
            for row, d in enumerate(batch.devices):
                v = float(batch.values[row, j])
                if v == v:
                    fam.add_metric([d.uuid, str(d.index or 0), d.name, d.host], v)
            yield fam


def main() -> None:
    REGISTRY.register(ReplayCollector(sys.argv[1]))
    start_http_server(int(sys.argv[2]), addr="127.0.0.1")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
