"""Benchmarks (run as modules, e.g. ``python -m bench.ledger_bench``); not tests."""
