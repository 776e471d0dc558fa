"""Benchmarks: each module prints numbers measured in its own run."""
