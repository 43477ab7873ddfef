"""Benchmark suites that time implementations side by side in one process and write tidy CSV rows.

A suite is a module ``tilefuse.bench.<name>_suite`` with ``run(opts: SuiteOptions) -> list[Row]``.
"""
