"""The studies, each a declared plan (studies/plan.py): `python -m experiments.study --plan=NAME`
runs `studies/plans/NAME.py`'s `PLANS[scale]`; a plan file elsewhere runs by its path."""
