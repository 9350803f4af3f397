"""Benchmarks: `python -m benchmarks NAME [--quick]`, one module per benchmark.

Each prints a readable table, then one JSON object as its last line. Variants are
compared side by side in one run, on the same data, because these machines are noisy.
"""
