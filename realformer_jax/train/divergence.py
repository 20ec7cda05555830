"""A step whose loss, gradients or new state are not finite stops the run before anything is
saved (loop.py checks every step's metrics before each save).

Where a rerun can resume from then: a step's loss and gradients depend only on the state, batch
and PRNG key before it, which is exactly what the checkpoint of the step before restores. So if
that checkpoint exists, every resume from it diverges again, whatever the optimizer config: the
error names it as a dead end (`DivergenceError.dead_end`), and the loop moves it aside
(checkpointing.Checkpointer.set_aside_diverged) so that a rerun with a corrected config resumes
from an earlier one. A non-finite state after finite gradients (an optimizer value that
overflows) is the update's doing: the checkpoint before it is good, and a corrected config
resumes from it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from realformer_jax.train.errors import DivergenceError


def check_finite(step: int, loss: float, metrics: Any, last_checkpoint: Optional[int]) -> None:
  """Raises DivergenceError if step `step`'s `loss`, gradients (`metrics['grads_finite']`) or
  new state (`metrics['state_finite']`, train/step.py) are not finite. `last_checkpoint`: the
  newest step saved or restored, the one a rerun would resume from."""
  if not math.isfinite(loss):
    what, replayed = f'non-finite loss {loss}', True
  elif not bool(metrics['grads_finite']):
    what, replayed = 'non-finite gradients', True
  elif not bool(metrics['state_finite']):
    # e.g. an optimizer value that overflows: the loss and gradients were still finite
    what, replayed = 'non-finite parameters or optimizer state after the update', False
  else:
    return
  if replayed and last_checkpoint is not None and last_checkpoint == step - 1:
    raise DivergenceError(
      f'{what} at step {step}, right after the checkpoint at step {last_checkpoint}, which '
      "every resume would replay exactly (a step's loss and gradients depend only on the "
      'state, batch and key it restores); stopped without saving',
      step,
      dead_end=last_checkpoint,
    )
  kept = f'step {last_checkpoint}' if last_checkpoint is not None else 'none'
  raise DivergenceError(
    f'{what} at step {step}; stopped without saving (last good checkpoint: {kept})', step
  )
