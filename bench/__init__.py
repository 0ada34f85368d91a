"""Benchmarks and the chaos run: `python -m bench.run_all`, `python -m bench.chaos`."""
