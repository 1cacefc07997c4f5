"""The request-level layer: workloads of requests, their checks and replays."""
