"""A small client for the Prometheus HTTP API (`/api/v1/series`, `/api/v1/query`, `/api/v1/query_range`).

Thanos Query, Mimir and VictoriaMetrics serve the same API, so this is all the fleet needs from them.
A range answer for a thousand GPUs is hundreds of MB of JSON; decoding it with `json.loads` makes three
Python objects per sample. Instead the answer is cut at its `"values":[` markers (which cannot occur
inside a JSON string: the quote would be escaped), each series' label object alone goes through
`json.loads`, and all sample pairs go through Arrow's CSV parser in one call, as columns.

Reading such an answer through httpx costs 8.5-13x the CPU of the standard library's `http.client`
(0.067-0.073 vs 0.006-0.008 CPU s per million samples, benchmarks/bench_fleet.py; httpx hands the body
over in 64 KiB pieces through several layers of Python). So plain-http endpoints without a proxy are read
with `http.client`, one kept-alive connection per thread; https, proxies, credentials in the URL and test
transports go through httpx.
"""

from __future__ import annotations

import gzip
import http.client
import io
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from phasescope.errors import InputError, SourceError
from phasescope.schema import FloatArray

# Prometheus refuses a range query with more than 11,000 points per series.
MAX_POINTS = 11_000

_SERIES_RE = re.compile(rb'\{\s*"metric"\s*:\s*(\{.*?\})\s*,\s*"values"\s*:\s*\[')
_WS = b" \t\r\n"
_CSV_READ = pacsv.ReadOptions(column_names=["t", "v"])
_CSV_CONVERT = pacsv.ConvertOptions(column_types={"t": pa.float64(), "v": pa.float64()})


# One lock for the clocks and the clients' connection lists: a StageClock is summed from threads
# (`fetch_traces`) and pickled across processes (`scan`'s workers), so it cannot hold a lock of its own.
_LOCK = threading.Lock()


@dataclass
class StageClock:
    """Wall and CPU seconds per stage of a fleet pass ("http", "decode", ...), summed over calls.

    CPU is the process's (`time.process_time`): it includes Arrow's and LightGBM's threads, and with several
    threads of ours in flight (`fetch_traces`) each stage also counts the others' CPU."""

    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - w, time.process_time() - c)

    def record(self, name: str, wall: float, cpu: float, calls: int = 1) -> None:
        with _LOCK:
            self.wall[name] = self.wall.get(name, 0.0) + wall
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            self.calls[name] = self.calls.get(name, 0) + calls

    def add(self, other: StageClock) -> None:
        for name, wall in other.wall.items():
            self.record(name, wall, other.cpu.get(name, 0.0), other.calls.get(name, 0))

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            k: {"wall_s": round(v, 3), "cpu_s": round(self.cpu.get(k, 0.0), 3), "calls": self.calls.get(k, 0)}
            for k, v in self.wall.items()
        }


@dataclass
class Series:
    """One series of a range answer: its labels and its samples as columns."""

    labels: dict[str, str]
    time: FloatArray
    values: FloatArray


def escape_regex(value: str) -> str:
    """`value` as a literal inside a PromQL (RE2) regex matcher string."""
    return re.sub(r"([.+*?()|\[\]{}^$\\])", r"\\\1", value).replace('"', '\\"')


def selector_body(selector: str) -> str:
    """The matchers inside a user's `{...}` selector (braces optional), to join with ours."""
    text = (selector or "").strip()
    if not text:
        return ""
    if (
        text.startswith("{") != text.endswith("}")
        or "{" in text[1:-1]
        or "}" in text[1:-1].replace('\\"', "")
    ):
        raise InputError(
            "--selector", "selector", 'label matchers like \'{namespace="ml",host=~"gpu-.*"}\'', selector
        )
    body = text[1:-1] if text.startswith("{") else text
    if body and not re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)", body):
        raise InputError("--selector", "selector", "label matchers like '{namespace=\"ml\"}'", selector)
    return body.strip().strip(",")


class PromClient:
    """Queries one Prometheus-compatible endpoint. Errors become one-line `SourceError`s."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 120.0,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not re.match(r"^https?://", url or ""):
            raise InputError("--prometheus", "URL", "http(s)://host:port[/prefix]", url)
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        try:
            self._target = (parts.hostname or "", parts.port or 80, parts.path)
        except ValueError:  # a port that is not a number
            raise InputError("--prometheus", "URL", "http(s)://host:port[/prefix]", url) from None
        # identity: on a loopback or LAN link gzip costs the server more CPU than it saves.
        hdrs = {"Accept-Encoding": "identity", **(headers or {})}
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=hdrs, transport=transport)
        self._headers = {**hdrs, "Content-Type": "application/x-www-form-urlencoded"}
        self._timeout = timeout_s
        # the module doc: the standard library's client where httpx would not do anything more
        self._direct = (
            transport is None
            and parts.scheme == "http"
            and parts.username is None  # basic auth in the URL: httpx sends it
            and not _proxied(parts.hostname or "")
        )
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self.clock = StageClock()  # "http" and "decode" of the range queries

    def close(self) -> None:
        self._http.close()
        with _LOCK:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def __enter__(self) -> PromClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------------

    def _post(self, path: str, data: dict[str, Any]) -> bytes:
        if self._direct:
            status, body = self._post_direct(path, data)
        else:
            try:
                resp = self._http.post(path, data=data)
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from None
            status, body = resp.status_code, resp.content
        if status != 200:
            raise SourceError(f"{self.url}{path}: HTTP {status}: {_api_error(body)}")
        return body

    def _unreachable(self, exc: Exception) -> SourceError:
        return SourceError(f"{self.url}: cannot reach the Prometheus API ({type(exc).__name__}: {exc})")

    def _post_direct(self, path: str, data: dict[str, Any]) -> tuple[int, bytes]:
        """(status, body) of a POST through this thread's kept-alive `http.client` connection."""
        host, port, prefix = self._target
        form = urllib.parse.urlencode(data).encode()
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        for reused in (conn is not None, False):
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=self._timeout)
                self._local.conn = conn
                with _LOCK:
                    self._conns.append(conn)
            try:
                conn.request("POST", prefix + path, form, self._headers)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = self._local.conn = None
                if reused and isinstance(exc, ConnectionError):
                    continue  # the server closed the kept-alive connection while it was idle: once more
                raise self._unreachable(exc) from None
            if resp.getheader("Content-Encoding", "").lower() == "gzip":  # a proxy that ignored "identity"
                body = gzip.decompress(body)
            return resp.status, body
        raise AssertionError("unreachable: the second try returns or raises")

    def _json(self, path: str, data: dict[str, Any]) -> Any:
        body = self._post(path, data)
        try:
            doc = json.loads(body)
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            raise SourceError(f"{self.url}{path}: expected a JSON API answer, got {body[:60]!r}")
        if doc.get("status") != "success":
            raise SourceError(f"{self.url}{path}: {_api_error(body)}")
        return doc.get("data")

    # -- API ---------------------------------------------------------------------------------------

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data = self._json("/api/v1/series", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})
        if not isinstance(data, list | None) or not all(isinstance(d, dict) for d in data or []):
            raise SourceError(f"{self.url}/api/v1/series: expected a list of label sets, got {_cut(data)}")
        return [dict(d) for d in data or []]

    def query(self, query: str, time: float) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series of a vector answer."""
        data = self._json("/api/v1/query", {"query": query, "time": f"{time:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise SourceError(f"{self.url}: expected a vector answer to {query[:60]!r}")
        try:
            return [(dict(r["metric"]), float(r["value"][1])) for r in data.get("result") or []]
        except (KeyError, IndexError, TypeError, ValueError):
            raise SourceError(
                f'{self.url}/api/v1/query: expected results of {{metric, value: [time, "value"]}} to '
                f"{query[:60]!r}, got {_cut(data.get('result'))}"
            ) from None

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """A range query, split in time so that no piece asks for more than MAX_POINTS points per series."""
        if step <= 0:
            raise InputError("--step", "step", "a positive number of seconds", step)
        span = MAX_POINTS - 1
        out: list[Series] = []
        t = start
        while t <= end:
            t_end = min(end, t + span * step)
            with self.clock.stage("http"):
                body = self._post(
                    "/api/v1/query_range",
                    {"query": query, "start": f"{t:.3f}", "end": f"{t_end:.3f}", "step": f"{step:g}"},
                )
            with self.clock.stage("decode"):
                out.extend(parse_matrix(body, f"{self.url}/api/v1/query_range"))
            t = t_end + step
        return out


def _proxied(host: str) -> bool:
    """Whether the environment sends plain-http requests to `host` through a proxy (httpx honours it)."""
    return "http" in urllib.request.getproxies() and not urllib.request.proxy_bypass(host)


def _cut(value: object, limit: int = 80) -> str:
    """A malformed answer's part, short enough for one line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _api_error(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return f"{doc.get('errorType', 'error')}: {doc.get('error', '')}"[:300]
    except (json.JSONDecodeError, AttributeError):
        return body[:120].decode("utf-8", "replace")


def parse_matrix(body: bytes, where: str = "query_range") -> list[Series]:
    """Series of a `matrix` answer, decoded columnar (see the module doc)."""
    head = body[:200]
    if b'"success"' not in head and b'"status"' in head:
        raise SourceError(f"{where}: {_api_error(body)}")
    labels: list[dict[str, str]] = []
    spans: list[tuple[int, int]] = []  # each series' sample pairs, without the outer brackets
    pos = 0
    for m in _SERIES_RE.finditer(body):
        if m.start() < pos:
            continue
        try:
            labels.append(json.loads(m.group(1)))
        except json.JSONDecodeError:
            raise SourceError(f"{where}: a series' labels are not JSON: {m.group(1)[:60]!r}") from None
        if body[m.end() : m.end() + 1] == b"]":  # "values":[]
            spans.append((m.end(), m.end()))
            pos = m.end() + 1
            continue
        stop = body.find(b"]]", m.end())
        if stop < 0:
            raise SourceError(f"{where}: a series' values are cut off")
        spans.append((m.end() + 1, stop))
        pos = stop + 2
    if not labels:
        return _parse_matrix_json(body, where)
    # Prometheus writes no whitespace: skip stripping it unless the compact reading fails.
    cols = _pairs(body, spans, where, strip=False, strict=False) or _pairs(body, spans, where, strip=True)
    if cols is None:
        return _parse_matrix_json(body, where)
    t_all, v_all, counts = cols
    out: list[Series] = []
    i = 0
    for lab, n in zip(labels, counts, strict=True):
        out.append(Series(lab, t_all[i : i + n], v_all[i : i + n]))
        i += n
    return out


def _pairs(
    body: bytes, spans: list[tuple[int, int]], where: str, *, strip: bool, strict: bool = True
) -> tuple[FloatArray, FloatArray, list[int]] | None:
    """All series' [t,"v"] pairs as two columns, in one Arrow CSV read, and each series' count.
    None when the samples do not add up (an unusual layout) or, unless `strict`, do not parse."""
    chunks: list[bytes] = []
    counts: list[int] = []
    for a, b in spans:
        pairs = body[a:b]
        if strip:
            pairs = pairs.translate(None, _WS)
        if not pairs:
            counts.append(0)
            continue
        chunks.append(pairs.replace(b"],[", b"\n"))
        counts.append(chunks[-1].count(b"\n") + 1)
    if not chunks:
        return np.zeros(0), np.zeros(0), counts
    try:
        table = pacsv.read_csv(io.BytesIO(b"\n".join(chunks)), _CSV_READ, convert_options=_CSV_CONVERT)
    except (pa.ArrowInvalid, ValueError) as exc:
        if not strict:
            return None
        raise SourceError(f'{where}: sample pairs are not [time, "value"]: {str(exc)[:80]}') from None
    t_all = table.column("t").to_numpy()
    v_all = table.column("v").to_numpy()  # "NaN" reads as null -> NaN
    if t_all.size != sum(counts):
        return None
    return t_all, v_all, counts


def _parse_matrix_json(body: bytes, where: str) -> list[Series]:
    """The plain decoder, for answers laid out unlike Prometheus' own (or with no series at all)."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise SourceError(f"{where}: expected a JSON API answer, got {body[:60]!r}")
    if doc.get("status") != "success":
        raise SourceError(f"{where}: {_api_error(body)}")
    data = doc.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = data.get("resultType") if isinstance(data, dict) else data
        raise SourceError(f"{where}: expected a matrix answer, got {_cut(got)}")
    out = []
    try:
        for r in data.get("result") or []:
            vals = r.get("values") or []
            out.append(
                Series(
                    dict(r.get("metric", {})),
                    np.array([float(p[0]) for p in vals], dtype=np.float64),
                    np.array([float(p[1]) for p in vals], dtype=np.float64),
                )
            )
    except (AttributeError, IndexError, TypeError, ValueError):
        raise SourceError(
            f'{where}: expected series of {{metric, values: [[time, "value"], ...]}}, got '
            f"{_cut(data.get('result'))}"
        ) from None
    return out
