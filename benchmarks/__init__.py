"""Benchmarks: `python -m benchmarks NAME [--quick | --tiny]`, one module per benchmark.

Each prints a readable table, then one JSON object as its last line (with the ``size`` it ran
at). Variants are compared side by side in one run, on the same data, because these machines
are noisy. ``--tiny`` (benchmarks/_cli.py) runs every step on the smallest data in seconds: CI
runs every module here that way (tests/test_benchmarks.py), so none can rot unnoticed.
"""
