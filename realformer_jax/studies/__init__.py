"""What the studies of experiments/ share, and benchmarks/ may use too: the scale, config and
scoring of one run, the command line, paired comparisons and plots (study.py), resumable run
grids with ETAs (runs.py), intervals and Holm's correction (stats.py), table cells, names and
the report files (report.py). It imports realformer_jax, never
experiments/ or benchmarks/ (tests/house/test_import_graph.py)."""
