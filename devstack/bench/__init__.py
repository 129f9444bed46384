"""Benchmarks. Each prints JSON lines with a pgbench baseline measured in the same run, because
the machine is small and noisy: ratios against the same server at the same moment are the
figures worth comparing, not absolute numbers."""
