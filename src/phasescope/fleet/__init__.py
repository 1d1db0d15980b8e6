"""Fleet view: classify every GPU that a Prometheus-compatible server (Prometheus, Thanos, Mimir,
VictoriaMetrics) holds, from phasescope's own metrics or dcgm-exporter's."""
