"""The studies: declared plans (plan.py, plans/) that one runner (runner.py) trains, resumes,
analyses (analysis.py, stats.py) and reports (plan_report.py, report.py), and what the research
scripts of experiments/ and the benchmarks share: a study's scale (scale.py, no JAX: a plan loads
without it), its config, training and scoring of one run (study.py), resumable run grids with ETAs
(runs.py), the machine a result came from (machine.py). At the top of the house with the commands
(tests/house/test_import_graph.py): nothing else in realformer_jax imports it. Light: importing
the package imports no submodule."""
