"""Serving-engine KPIs from real captured /metrics scrapes (vLLM, TGI), parsed and served over real HTTP."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from phasescope.cli.scrape import command as scrape_command
from phasescope.errors import InputError, SourceError
from phasescope.sources.scrape import Histogram, fetch, histogram_quantile, parse_text, read_file, server_kpis
from tests.http_helpers import serving

VLLM_V0V1 = "formats/vllm-metrics/DataDog__integrations-core__vllm_metrics.txt"
VLLM_IDLE = ("formats/vllm-metrics/"
             "cncf__k8s-ai-conformance__kops_Test_SchedulingOrchestration_PodAutoscaling_vllm-metrics.txt")
VLLM_START = "formats/vllm-metrics/FerranAgulloLopez__vLLMBatchingMemoryGap__cache_config_server_0.txt"
TGI = "formats/tgi-metrics/DataDog__integrations-core__hugging_face_tgi_payload.txt"


def raw_sum(text: str, pattern: str) -> float:
    """Sum of the values of sample lines whose name matches `pattern` exactly: an independent reading."""
    rx = re.compile(rf"^{pattern}(?:\{{[^}}]*\}})?\s+(\S+)", re.M)
    return sum(float(v) for v in rx.findall(text))


def test_vllm_capture_since_start(shared_data: Path) -> None:
    path = shared_data / VLLM_V0V1
    text = path.read_text()
    (k,) = server_kpis(read_file(path))
    assert k["engine"] == "vllm" and k["models"] == ["facebook/opt-125m"] and k["basis"] == "since start"
    assert k["requests"] == raw_sum(text, "vllm:request_success_total")
    assert k["generated_tokens"] == raw_sum(text, "vllm:generation_tokens_total")
    assert k["prompt_tokens"] == raw_sum(text, "vllm:prompt_tokens_total")
    assert k["requests_per_s"] is None and k["tokens_per_s"] is None  # one scrape: no rate
    # one request: its TTFT (the histogram's _sum) lies in the bucket the percentiles interpolate in
    ttft_sum = raw_sum(text, "vllm:time_to_first_token_seconds_sum")
    assert k["ttft_s"]["count"] == 1 and k["ttft_s"]["mean"] == pytest.approx(ttft_sum)
    les = [0.25, 0.5]  # the bucket holding it in this capture
    assert les[0] < ttft_sum <= les[1]
    for q in ("p50", "p95", "p99"):
        assert les[0] <= k["ttft_s"][q] <= les[1]
    assert k["ttft_s"]["p50"] < k["ttft_s"]["p95"] < k["ttft_s"]["p99"]
    # V1's inter_token_latency_seconds is preferred over V0's time_per_output_token_seconds
    assert k["inter_token_s"]["count"] == raw_sum(text, "vllm:inter_token_latency_seconds_count")
    assert k["latency_s"]["mean"] == pytest.approx(raw_sum(text, "vllm:e2e_request_latency_seconds_sum"))


def test_tgi_capture(shared_data: Path) -> None:
    text = (shared_data / TGI).read_text()
    (k,) = server_kpis(read_file(shared_data / TGI))
    assert k["engine"] == "tgi"
    assert k["requests"] == raw_sum(text, "tgi_request_success") == 109
    assert k["prompt_tokens"] == raw_sum(text, "tgi_request_input_length_sum")
    assert k["waiting"] == raw_sum(text, "tgi_queue_size")
    # the capture is cut after tgi_request_input_length: no duration histograms, so no latency is made up
    assert k["latency_s"] is None and k["inter_token_s"] is None and k["ttft_s"] is None


def test_vllm_server_start_scrape_has_no_requests_yet(shared_data: Path) -> None:
    (k,) = server_kpis(read_file(shared_data / VLLM_START))
    assert k["engine"] == "vllm" and k["requests"] is None  # this vLLM 0.5 fork exports no success counter
    assert k["running"] == 0 and k["generated_tokens"] == 0 and k["latency_s"] is None


def test_two_scrapes_give_rates_over_the_window(shared_data: Path) -> None:
    before = read_file(shared_data / VLLM_IDLE)  # an idle vLLM V1: every counter 0
    after = read_file(shared_data / VLLM_V0V1)
    before.t, after.t = 100.0, 110.0
    (k,) = server_kpis(after, before)
    assert k["basis"] == "window" and k["window_s"] == 10.0
    assert k["requests_per_s"] == pytest.approx(k["requests"] / 10.0) and k["requests"] > 0
    assert k["tokens_per_s"] == pytest.approx(k["generated_tokens"] / 10.0)
    # the same scrape twice: nothing happened in between
    again = read_file(shared_data / VLLM_V0V1)
    again.t = 120.0
    (z,) = server_kpis(again, after)
    assert z["requests"] == 0 and z["requests_per_s"] == 0 and z["tokens_per_s"] == 0
    assert z["ttft_s"] is None and z["latency_s"] is None  # no observations in the window


def test_counter_reset_counts_from_zero(shared_data: Path) -> None:
    before = read_file(shared_data / VLLM_V0V1)
    after = read_file(shared_data / VLLM_IDLE)  # "restarted": lower counters than before
    before.t, after.t = 0.0, 5.0
    (k,) = server_kpis(after, before)
    assert k["requests"] == 0 and k["requests_per_s"] == 0


def test_histogram_quantile_matches_prometheus_rules() -> None:
    rng = np.random.default_rng(0)
    x = rng.lognormal(-2.0, 0.6, 20000)
    bounds = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, np.inf])
    counts = np.array([(x <= b).sum() for b in bounds], dtype=np.float64)
    h = Histogram(bounds, counts, float(x.size), float(x.sum()))
    for q in (0.5, 0.95, 0.99):
        est, true = histogram_quantile(h, q), np.quantile(x, q)
        i = np.searchsorted(bounds, true)
        assert est is not None and bounds[i - 1] <= est <= bounds[i]  # same bucket as the true quantile
    # linear interpolation is exact where observations are spread evenly inside the buckets
    u = rng.uniform(0.0, 1.0, 20000)
    ub = np.append(np.linspace(0.1, 1.0, 10), np.inf)
    cu = np.array([(u <= b).sum() for b in ub], dtype=np.float64)
    hu = Histogram(ub, cu, float(u.size), float(u.sum()))
    for q in (0.5, 0.95, 0.99):
        assert histogram_quantile(hu, q) == pytest.approx(np.quantile(u, q), abs=0.01)
    # a rank in the +Inf bucket answers the highest finite bound; no observations answer None
    tail = Histogram(np.array([1.0, np.inf]), np.array([1.0, 10.0]), 10.0, 50.0)
    assert histogram_quantile(tail, 0.99) == 1.0
    assert histogram_quantile(Histogram(bounds, np.zeros(bounds.size), 0.0, 0.0), 0.5) is None


def test_curl_noise_is_ignored_and_garbage_is_one_clear_error(shared_data: Path) -> None:
    text = (shared_data / VLLM_V0V1).read_text()
    noisy = ("  % Total    % Received % Xferd  Average Speed   Time    Time     Time  Current\n"
             "100 21464  100 21464    0     0  1048k      0 --:--:-- --:--:-- --:--:-- 1048k\n" + text)
    assert server_kpis(parse_text(noisy, "noisy")) == server_kpis(parse_text(text, "noisy"))
    with pytest.raises(InputError, match=r"^junk\.txt: metrics text: expected at least one Prometheus"):
        parse_text("<html>502 Bad Gateway</html>\n", "junk.txt")
    with pytest.raises(InputError, match=r"^bad: metrics text: expected Prometheus text exposition"):
        parse_text("vllm:num_requests_running{model_name=\"a\"} not-a-number\n", "bad")


def test_bad_bucket_bound_and_header_only_pages_are_one_clear_error() -> None:
    """A non-numeric `le` used to raise a bare ValueError later, in server_kpis (a traceback from `scrape`,
    and from `run --scrape` after the command had run); a page of HELP/TYPE lines only passed as metrics."""
    hist = "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    bad = (hist + 'vllm:e2e_request_latency_seconds_bucket{le="soon"} 3\n'
           "vllm:e2e_request_latency_seconds_count 3\n")
    with pytest.raises(InputError, match=r"^bad: vllm:e2e_request_latency_seconds_bucket le: expected a num"):
        parse_text(bad, "bad")
    with pytest.raises(InputError, match=r"^empty: metrics text: expected at least one Prometheus sample"):
        parse_text("# HELP vllm:e2e_request_latency_seconds latency\n" + hist, "empty")


def test_scrape_json_that_cannot_be_written_is_one_line(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.cli import main

    out = tmp_path / "no-such-dir" / "kpis.json"
    assert main(["scrape", str(shared_data / VLLM_V0V1), "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json: expected a writable file path" in err[0]


@pytest.mark.parametrize("option", [["--timeout", "-1"], ["--timeout", "0"], ["--window", "inf"]])
def test_scrape_bad_numbers_are_usage_errors(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--timeout -1 and --window inf used to end in a traceback (socket timeout, time.sleep)."""
    from phasescope.cli import main

    assert main(["scrape", "http://127.0.0.1:9/metrics", *option]) == 2
    err = capsys.readouterr().err
    assert option[0] in err and "Traceback" not in err


def test_triton_names() -> None:
    # No real Triton capture is available; this exposition uses Triton's documented metric names and units
    # (cumulative microsecond counters, first-response histogram in ms) to check the mapping only.
    text = "\n".join([
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="resnet",version="1"} 40',
        "# TYPE nv_inference_count counter", 'nv_inference_count{model="resnet",version="1"} 160',
        "# TYPE nv_inference_exec_count counter", 'nv_inference_exec_count{model="resnet",version="1"} 20',
        "# TYPE nv_inference_request_duration_us counter",
        'nv_inference_request_duration_us{model="resnet",version="1"} 2000000',
        "# TYPE nv_inference_pending_request_count gauge",
        'nv_inference_pending_request_count{model="resnet",version="1"} 3', ""])
    (k,) = server_kpis(parse_text(text, "triton"))
    assert k["engine"] == "triton" and k["models"] == ["resnet"]
    assert k["requests"] == 40 and k["batch_size_mean"] == 8 and k["waiting"] == 3
    assert k["latency_s"]["mean"] == pytest.approx(2.0 / 40) and k["latency_s"]["p50"] is None


def test_sglang_names() -> None:
    # No SGLang capture is available; this exposition uses the names and units of SGLang's production-metrics
    # docs (with --enable-metrics) to check the mapping only.
    def hist(name: str, bounds: list[float], counts: list[int], total: float) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        pairs = zip(bounds, counts, strict=True)
        lines += [f'{name}_bucket{{le="{b}",model_name="m"}} {c}' for b, c in pairs]
        lines += [f'{name}_bucket{{le="+Inf",model_name="m"}} {counts[-1]}',
                  f'{name}_sum{{model_name="m"}} {total}', f'{name}_count{{model_name="m"}} {counts[-1]}']
        return lines

    text = "\n".join([
        "# TYPE sglang:num_requests_total counter", 'sglang:num_requests_total{model_name="m"} 100',
        "# TYPE sglang:generation_tokens_total counter",
        'sglang:generation_tokens_total{model_name="m"} 5000',
        "# TYPE sglang:prompt_tokens_total counter", 'sglang:prompt_tokens_total{model_name="m"} 2000',
        "# TYPE sglang:num_running_reqs gauge", 'sglang:num_running_reqs{model_name="m"} 4',
        "# TYPE sglang:num_queue_reqs gauge", 'sglang:num_queue_reqs{model_name="m"} 2',
        *hist("sglang:e2e_request_latency_seconds", [0.5, 1.0, 2.0], [10, 60, 100], 110.0),
        *hist("sglang:time_to_first_token_seconds", [0.05, 0.1, 0.2], [20, 90, 100], 9.0), ""])
    (k,) = server_kpis(parse_text(text, "sglang"))
    assert k["engine"] == "sglang" and k["requests"] == 100 and k["running"] == 4 and k["waiting"] == 2
    assert 0.5 < k["latency_s"]["p50"] <= 1.0 and 0.05 < k["ttft_s"]["p50"] <= 0.1
    from phasescope.sources.process_kind import ENGINES

    assert next(e for e in ENGINES if e.name == "SGLang").scrape == "sglang"  # found on a GPU: scraped


class _Files:
    """What the local /metrics server answers: the captured files, in turn (the last one repeats)."""

    def __init__(self, paths: list[Path]) -> None:
        self.bodies = [p.read_bytes() for p in paths]
        self.served = 0


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, _Files]]:
    files = _Files([])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = files.bodies[min(files.served, len(files.bodies) - 1)]
            files.served += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url, files


def test_scrape_command_over_http_window(shared_data: Path, metrics_server: tuple[str, _Files],
                                         tmp_path: Path) -> None:
    url, files = metrics_server
    files.bodies = [(shared_data / VLLM_IDLE).read_bytes(), (shared_data / VLLM_V0V1).read_bytes()]
    out = tmp_path / "kpis.json"
    res = CliRunner().invoke(scrape_command, [f"{url}/metrics", "--window", "0.3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    (k,) = json.loads(out.read_text())
    assert files.served == 2 and k["basis"] == "window" and 0.3 <= k["window_s"] < 5
    expected = raw_sum((shared_data / VLLM_V0V1).read_text(), "vllm:request_success_total")
    assert k["requests"] == expected and k["requests_per_s"] == pytest.approx(expected / k["window_s"])
    assert "requests/s" in res.output


def test_fetch_errors_are_one_line(metrics_server: tuple[str, _Files]) -> None:
    url, _ = metrics_server
    with pytest.raises(SourceError, match=r"/nope: scrape: expected HTTP 200, got 404"):
        fetch(f"{url}/nope")
    proc = subprocess.run([sys.executable, "-m", "phasescope", "scrape", "http://127.0.0.1:9/metrics",
                           "--window", "0", "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "expected a reachable /metrics endpoint" in proc.stderr


def test_run_scrapes_a_server_while_the_command_runs(shared_data: Path, metrics_server: tuple[str, _Files],
                                                     tmp_path: Path) -> None:
    url, files = metrics_server
    files.bodies = [(shared_data / VLLM_V0V1).read_bytes()]
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--report", "-", "--json", str(out),
           "--scrape", f"{url}/metrics", "--scrape-interval", "0.2", "--",
           sys.executable, "-c", "import time; time.sleep(0.6)"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    (k,) = doc["servers"]
    assert k["engine"] == "vllm" and k["basis"] == "window" and files.served >= 2
    assert k["requests"] == 0 and k["requests_per_s"] == 0  # the captured server did nothing meanwhile
    assert "vllm at" in proc.stderr


def test_a_capture_without_type_lines_gives_the_same_kpis(shared_data: Path) -> None:
    """`curl -s URL/metrics | grep -v '^#' > m.txt` drops the `# TYPE` lines: every sample name then parsed
    as an untyped family of its own, and `scrape m.txt` silently lost requests, latency and tokens."""
    text = (shared_data / VLLM_V0V1).read_text()
    bare = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    (k,) = server_kpis(parse_text(bare, "bare"))
    (want,) = server_kpis(parse_text(text, "bare"))
    assert k == want and k["requests"] == 1 and k["latency_s"] is not None and k["generated_tokens"] > 0
    with pytest.raises(InputError, match=r"^bad: vllm:e2e_request_latency_seconds_bucket le: expected a num"):
        parse_text('vllm:e2e_request_latency_seconds_bucket{le="soon"} 3\n', "bad")


def test_a_restart_between_scrapes_counts_from_zero_even_past_the_old_totals(shared_data: Path) -> None:
    """A server that restarted and has since served more than before its restart: every counter is higher
    than in the first scrape, so only the process start time shows the reset; the window used to report
    the difference (here none at all) instead of everything since the restart."""
    text = (shared_data / VLLM_V0V1).read_text()
    before = parse_text(text, "before", t=100.0)
    restarted = re.sub(r"^process_start_time_seconds .*$", "process_start_time_seconds 1.8e+09", text,
                       flags=re.M)
    after = parse_text(restarted, "after", t=110.0)
    (k,) = server_kpis(after, before)
    (since_start,) = server_kpis(after)
    assert k["basis"] == "window" and k["requests"] == since_start["requests"] == 1
    assert k["latency_s"] == since_start["latency_s"] and k["requests_per_s"] == pytest.approx(0.1)
    (same,) = server_kpis(parse_text(text, "again", t=110.0), before)  # no restart: nothing happened
    assert same["requests"] == 0 and same["latency_s"] is None
