"""One Prometheus text-format scrape, parsed with prometheus_client and summed across label sets.

Serving engines label their series by model, engine replica and finish reason; the KPIs are per server, so
every accessor sums over label sets (histograms bucket by bucket). Lines that are not exposition format
(curl progress meters, shell prompts pasted with a capture) are dropped before parsing.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from phasescope.errors import InputError, SourceError

_EXPOSITION_LINE = re.compile(r"^(#|[a-zA-Z_:][a-zA-Z0-9_:]*(\{|\s))")


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram summed over label sets: `counts[i]` observations were <= `bounds[i]`."""

    bounds: npt.NDArray[np.float64]  # ascending, last is +inf
    counts: npt.NDArray[np.float64]  # cumulative
    total: float  # _count
    sum: float  # _sum

    def __sub__(self, earlier: Histogram) -> Histogram:
        """The observations made between two scrapes (same bucket layout); a server restart resets to self."""
        if not np.array_equal(self.bounds, earlier.bounds):
            return self
        counts = self.counts - earlier.counts
        if self.total < earlier.total or np.any(counts < 0):
            return self  # counter reset: everything in self is new
        return Histogram(self.bounds, counts, self.total - earlier.total, self.sum - earlier.sum)


@dataclass
class Scrape:
    """Samples of one scrape keyed by family name; `t` is the Unix time it was taken (None: unknown)."""

    where: str
    t: float | None
    types: dict[str, str] = field(default_factory=dict)
    # family -> list of (sample name, labels, value)
    samples: dict[str, list[tuple[str, dict[str, str], float]]] = field(default_factory=dict)

    def has(self, family: str) -> bool:
        return family in self.samples

    def labels(self, family: str, key: str) -> list[str]:
        return sorted({lab[key] for _, lab, _ in self.samples.get(family, []) if key in lab})

    def value(self, family: str) -> float | None:
        """Counter or gauge, summed over label sets; None when the server does not export it."""
        rows = self.samples.get(family)
        if not rows:
            return None
        if self.types.get(family) == "counter":
            # prometheus_client names counter samples <family>_total even where the server wrote no suffix
            rows = [r for r in rows if r[0] == family + "_total"]
        return float(sum(v for _, _, v in rows))

    def histogram(self, family: str) -> Histogram | None:
        rows = self.samples.get(family)
        if not rows or self.types.get(family) != "histogram":
            return None
        by_le: dict[float, float] = {}
        total = hsum = 0.0
        for name, lab, v in rows:
            if name.endswith("_bucket") and "le" in lab:
                le = float(lab["le"])
                by_le[le] = by_le.get(le, 0.0) + v
            elif name.endswith("_count"):
                total += v
            elif name.endswith("_sum"):
                hsum += v
        if not by_le:
            return None
        bounds = np.array(sorted(by_le), dtype=np.float64)
        counts = np.array([by_le[b] for b in bounds], dtype=np.float64)
        return Histogram(bounds, counts, total or float(counts[-1]), hsum)

    def quantiles(self, family: str) -> dict[float, float]:
        """A summary's precomputed quantiles (Triton's optional *_summary_us), averaged over label sets."""
        acc: dict[float, list[float]] = {}
        for name, lab, v in self.samples.get(family, []):
            if name == family and "quantile" in lab and np.isfinite(v):
                acc.setdefault(float(lab["quantile"]), []).append(v)
        return {q: float(np.mean(v)) for q, v in acc.items()}


def parse_text(text: str, where: str = "<metrics>", t: float | None = None) -> Scrape:
    """Parse Prometheus text exposition; raises InputError naming `where` when nothing in it is metrics."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise SourceError(f"{where}: scrape: expected the prometheus-client package "
                          "(pip install 'phasescope[web]'), got none installed") from exc
    lines = [ln for ln in text.splitlines() if not ln.strip() or _EXPOSITION_LINE.match(ln)]
    scrape = Scrape(where, t)
    try:
        for fam in text_string_to_metric_families("\n".join(lines) + "\n"):
            # _created: creation times of counters, not measurements; no samples: only HELP/TYPE lines (a
            # labelled metric nobody has observed yet), which says nothing and must not count as metrics.
            if fam.name.endswith("_created") or not fam.samples:
                continue
            bad = [s for s in fam.samples if fam.type == "histogram" and s.name.endswith("_bucket")
                   and not _is_number(s.labels.get("le"))]
            if bad:
                raise InputError(where, f"{bad[0].name} le", "a number (the bucket's upper bound)",
                                 bad[0].labels.get("le"))
            scrape.types[fam.name] = fam.type
            scrape.samples.setdefault(fam.name, []).extend(
                (s.name, dict(s.labels), float(s.value)) for s in fam.samples)
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(where, "metrics text", "Prometheus text exposition format", str(exc)) from exc
    if not scrape.samples:
        raise InputError(where, "metrics text", "at least one Prometheus sample",
                         f"{len(text.splitlines())} lines without one")
    _fold_untyped(scrape)
    return scrape


def _fold_untyped(scrape: Scrape) -> None:
    """Without its `# TYPE` lines (a capture saved through `grep -v '^#'`) every sample name parses as an
    untyped family of its own: put a counter's `_total` and a histogram's `_bucket`/`_count`/`_sum` back
    under the family name the engines' KPIs look up."""
    untyped = [n for n, t in scrape.types.items() if t == "unknown"]
    for name in untyped:
        base = name.removesuffix("_bucket")
        rows = scrape.samples.get(name, [])
        if base == name or base in scrape.samples or not all("le" in lab for _, lab, _ in rows):
            continue
        if not all(_is_number(lab["le"]) for _, lab, _ in rows):
            raise InputError(scrape.where, f"{name} le", "a number (the bucket's upper bound)",
                             next(lab["le"] for _, lab, _ in rows if not _is_number(lab["le"])))
        for part in (name, base + "_count", base + "_sum"):
            if scrape.types.get(part) == "unknown":
                del scrape.types[part]
                scrape.samples.setdefault(base, []).extend(scrape.samples.pop(part))
        scrape.types[base] = "histogram"
    for name in untyped:
        base = name.removesuffix("_total")
        if base != name and scrape.types.get(name) == "unknown" and base not in scrape.samples:
            del scrape.types[name]
            scrape.samples[base] = scrape.samples.pop(name)
            scrape.types[base] = "counter"


def _is_number(text: str | None) -> bool:
    try:
        float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def read_file(path: str | Path) -> Scrape:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise InputError(p, "file", "a readable /metrics capture", exc.strerror or str(exc)) from exc
    return parse_text(text, str(p), t=p.stat().st_mtime)


def fetch(url: str, timeout: float = 5.0) -> Scrape:
    """GET a /metrics page; an unreachable server or a non-200 answer is a SourceError naming the URL."""
    try:
        import httpx
    except ImportError as exc:
        raise SourceError(f"{url}: scrape: expected the httpx package (pip install 'phasescope[web]'), "
                          "got none installed") from exc

    t = time.time()
    try:
        resp = httpx.get(url, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise SourceError(f"{url}: scrape: expected a reachable /metrics endpoint, got "
                          f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise SourceError(f"{url}: scrape: expected HTTP 200, got {resp.status_code}")
    return parse_text(resp.text, url, t=t)
