"""Test-wide JAX settings: CI has 2 cores, and compile time dominates these tiny models."""

import jax

jax.config.update('jax_disable_most_optimizations', True)
