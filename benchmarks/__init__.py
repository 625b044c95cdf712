"""Side-by-side measurements of rvsup against its peers (``python -m benchmarks``).

Benchmarks are programs, not tests: they print comparison tables (one column per tool, measured in
one run on the same workload) and write JSON to ``benchmarks/results/``. See benchmarks/README.md.
"""
