"""Prometheus text format for `/metrics`, written faster than `prometheus_client.generate_latest`.

The collector still builds every value fresh per scrape; what is cached here is only the text of each label
set (`{gpu="0",host="h",...}`), which is the same scrape after scrape. generate_latest re-validates and
re-escapes every label of every sample each time, which is most of a scrape's cost at 8 GPUs. The output is
byte-for-byte what generate_latest writes for gauge and counter families (tested); any other family type is
handed to generate_latest itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

_MAX_CACHED = 8192  # label sets; a churning fleet (containers coming and going) cannot grow it without bound


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _One:
    """A registry holding one family: lets generate_latest format a type this module does not."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


class TextWriter:
    """Renders metric families to the Prometheus text format, caching each label set's text."""

    def __init__(self) -> None:
        self._labels: dict[tuple[tuple[str, str], ...], str] = {}

    def _labelstr(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        text = self._labels.get(key)
        if text is None:
            if len(self._labels) >= _MAX_CACHED:
                self._labels.clear()
            inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
            text = self._labels[key] = f"{{{inner}}}" if inner else ""
        return text

    def render(self, families: Iterable[Metric]) -> bytes:
        out: list[str] = []
        for metric in families:
            if metric.type not in ("gauge", "counter"):
                out.append(generate_latest(_One(metric)).decode())
                continue
            name = metric.name + "_total" if metric.type == "counter" else metric.name
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
            created = []
            for s in metric.samples:
                line = f"{s.name}{self._labelstr(s.labels)} {floatToGoString(s.value)}"
                if s.timestamp is not None:
                    line += f" {int(float(s.timestamp) * 1000):d}"
                if s.name == metric.name + "_created":  # generate_latest moves these to a gauge at the end
                    created.append(line + "\n")
                else:
                    out.append(line + "\n")
            if created:
                out.append(f"# HELP {metric.name}_created {doc}\n# TYPE {metric.name}_created gauge\n")
                out.extend(created)
        return "".join(out).encode()
