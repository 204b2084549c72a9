"""The benchmarks: modules that measure speed, scale and success on this checkout and print figures.

Each one runs from the repository root as `python -m benchmarks.NAME` (its docstring gives the usage);
the package is not installed (it measures the checkout it sits in). Code two of them need lives in a
module of its own: `benchmarks.common` (paths, the commit a report names, timing and writing helpers),
`benchmarks.held_out_games` (ALFWorld held-out games without a training twin),
`benchmarks.retrieval_load` (the retrieval server's load generator) and `benchmarks.cpu_bound_env`
(an env whose steps compute for a set time). Benchmarks import everything; nothing but the tests
imports them (tests/test_layers.py).
"""
