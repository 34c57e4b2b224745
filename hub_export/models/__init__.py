"""Models the demo, tests and benchmarks use: tiny random ones built in seconds, and the real ones that PyPI packages ship."""
