"""Kiln benchmarks: each script prints a table and writes JSON under bench/results/."""
