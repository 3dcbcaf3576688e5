"""Benchmark tasks and runners: what compression costs and buys, measured side by side."""
