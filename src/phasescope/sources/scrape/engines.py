"""Which metric of each serving engine answers which KPI question.

Names are the engines' own, as documented and as seen in the real captures under shared/data/formats:
- vLLM (V0 and V1 names; colon-prefixed `vllm:`): request, TTFT and inter-token histograms in seconds;
- Hugging Face TGI (`tgi_`): request duration and per-token histograms in seconds, token counts as
  histograms whose `_sum` is the running total; no TTFT metric;
- SGLang (`sglang:`): request counter, end-to-end, TTFT and inter-token histograms in seconds (its
  production-metrics docs; no capture in shared/data, so only the mapping is tested);
- NVIDIA Triton (`nv_inference_`): cumulative microsecond counters (mean latency only), an optional
  `_summary_us` summary with quantiles, and, for decoupled (streaming) models, a first-response histogram
  in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasescope.sources.scrape.parse import Scrape


@dataclass(frozen=True)
class EngineMetrics:
    name: str
    prefix: str
    requests: tuple[str, ...]  # counters of finished requests (summed)
    latency_hist: tuple[str, ...] = ()  # first one present wins
    ttft_hist: tuple[str, ...] = ()
    itl_hist: tuple[str, ...] = ()  # inter-token latency
    hist_scale: float = 1.0  # to seconds
    ttft_scale: float = 1.0
    gen_tokens: str | None = None  # counter of generated tokens
    gen_tokens_hist: str | None = None  # ... or a histogram whose _sum counts them
    prompt_tokens: str | None = None
    prompt_tokens_hist: str | None = None
    latency_us_counter: str | None = None  # cumulative request time, microseconds (mean latency)
    latency_summary: str | None = None  # summary with quantiles, microseconds
    running: str | None = None  # gauges
    waiting: str | None = None
    inferences: str | None = None  # Triton: inferences (batch items) and executions -> mean batch size
    executions: str | None = None
    kv_cache: tuple[str, ...] = ()
    model_label: str = "model_name"


ENGINES: dict[str, EngineMetrics] = {
    "vllm": EngineMetrics(
        "vllm", "vllm:", requests=("vllm:request_success",),
        latency_hist=("vllm:e2e_request_latency_seconds",),
        ttft_hist=("vllm:time_to_first_token_seconds",),
        itl_hist=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        gen_tokens="vllm:generation_tokens", prompt_tokens="vllm:prompt_tokens",
        running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
        kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "tgi": EngineMetrics(
        "tgi", "tgi_", requests=("tgi_request_success",),
        latency_hist=("tgi_request_duration",),
        itl_hist=("tgi_request_mean_time_per_token_duration",),
        gen_tokens_hist="tgi_request_generated_tokens", prompt_tokens_hist="tgi_request_input_length",
        running="tgi_batch_current_size", waiting="tgi_queue_size", model_label=""),
    # SGLang (`sglang:`, with --enable-metrics): names from its production-metrics docs, seconds throughout.
    "sglang": EngineMetrics(
        "sglang", "sglang:", requests=("sglang:num_requests",),
        latency_hist=("sglang:e2e_request_latency_seconds",),
        ttft_hist=("sglang:time_to_first_token_seconds",),
        itl_hist=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        gen_tokens="sglang:generation_tokens", prompt_tokens="sglang:prompt_tokens",
        running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs", kv_cache=("sglang:token_usage",)),
    "triton": EngineMetrics(
        "triton", "nv_inference_", requests=("nv_inference_request_success",),
        ttft_hist=("nv_inference_first_response_histogram_ms",), ttft_scale=1e-3,
        latency_us_counter="nv_inference_request_duration_us",
        latency_summary="nv_inference_request_summary_us",
        waiting="nv_inference_pending_request_count",
        inferences="nv_inference_count", executions="nv_inference_exec_count", model_label="model"),
}


def detect_engines(scrape: Scrape) -> list[EngineMetrics]:
    """The engines whose metrics this scrape holds (one endpoint normally serves one)."""
    return [e for e in ENGINES.values() if any(f.startswith(e.prefix) for f in scrape.samples)]
