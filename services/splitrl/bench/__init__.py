"""Benchmarks that print figures: `splitrl bench network` (bytes at matched learning) and its report."""
