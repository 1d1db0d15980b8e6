"""The fleet's real traces serve the Prometheus client's tests too."""

from tests.fleet.conftest import fleet_traces  # noqa: F401
