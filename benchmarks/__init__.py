"""Benchmarks: each module exposes `run() -> dict` of figures measured side by side in one run."""
