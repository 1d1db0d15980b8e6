"""A small client for the Prometheus HTTP API (`/api/v1/series`, `/api/v1/query`, `/api/v1/query_range`).

Thanos Query, Mimir and VictoriaMetrics serve the same API, so this is all the fleet needs from them.
A range answer for a thousand GPUs is hundreds of MB of JSON; decoding it with `json.loads` makes three
Python objects per sample. Instead the answer is cut at its `"values":[` markers (which cannot occur
inside a JSON string: the quote would be escaped), each series' label object alone goes through
`json.loads`, and all sample pairs go through Arrow's CSV parser in one call, as columns.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
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
        # identity: on a loopback or LAN link gzip costs the server more CPU than it saves.
        hdrs = {"Accept-Encoding": "identity", **(headers or {})}
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=hdrs, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PromClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------------

    def _post(self, path: str, data: dict[str, Any]) -> bytes:
        try:
            resp = self._http.post(path, data=data)
        except httpx.HTTPError as exc:
            raise SourceError(
                f"{self.url}: cannot reach the Prometheus API ({type(exc).__name__}: {exc})"
            ) from None
        body = resp.content
        if resp.status_code != 200:
            raise SourceError(f"{self.url}{path}: HTTP {resp.status_code}: {_api_error(body)}")
        return body

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
            body = self._post(
                "/api/v1/query_range",
                {"query": query, "start": f"{t:.3f}", "end": f"{t_end:.3f}", "step": f"{step:g}"},
            )
            out.extend(parse_matrix(body, f"{self.url}/api/v1/query_range"))
            t = t_end + step
        return out


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
