"""Benchmarks of rlanything, each run from the repository root as `python -m benchmarks.NAME`."""
