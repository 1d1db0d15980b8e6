"""Prometheus: metric names, the text exposition of /metrics, and the HTTP API client the fleet reads with."""
