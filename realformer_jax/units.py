"""Byte units shared by the memory budgets, estimates and reports (decimal GB / TB rates of a
datasheet stay where they are quoted, realformer_jax/aot/targets.py)."""

GiB = 2**30
