"""A run of the whole stack on one machine: its description (settings), the services it plans from it (plan),
their processes (launcher), and what it leaves in its directory (files, summary, evaluate).

`splitrl up` (splitrl.cli.up) and the benchmarks (splitrl.bench) both build on this package; it imports neither.
"""
