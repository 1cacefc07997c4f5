"""How a conformance run runs: the pytest plugin, effort, progress, start-up, manifests."""
