"""Where telemetry is kept: the embedded live store and the crash-safe recording format."""
