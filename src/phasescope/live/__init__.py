"""The live pipeline: sampler, state, classifier, annotations and history (top, serve, demo, run)."""
