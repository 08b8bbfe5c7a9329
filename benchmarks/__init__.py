"""Benchmarks: shopstream against the peers a user would pick instead, in the same run."""
