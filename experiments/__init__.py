"""The repository's entry points (`python -m experiments.<name>`): each command's logic lives in
realformer_jax/commands/ (installed with the package); the research scripts here (not installed)
share its one-line handling of a missing extra by importing that package."""

import realformer_jax.commands  # the hook: a missing optional dependency is one `error:` line
