"""A step whose loss, gradients or new state are not finite, or whose loss has exploded, stops
the run before anything is saved (loop.py checks every step's metrics before each save).

Where a rerun can resume from then: a step's loss and gradients depend only on the state, batch
and PRNG key before it, which is exactly what the checkpoint of the step before restores. So if
that checkpoint exists, every resume from it diverges again, whatever the optimizer config: the
error names it as a dead end (`DivergenceError.dead_end`), and the loop moves it aside
(checkpointing.Checkpointer.set_aside_diverged) so that a rerun with a corrected config resumes
from an earlier one. A non-finite state after finite gradients (an optimizer value that
overflows) is the update's doing: the checkpoint before it is good, and a corrected config
resumes from it.

The state saved at the last step is judged by no later step's loss: the final evaluation
checks its eval loss by the same rule (`check_final_eval`).

An explosion can stay finite for several steps (learning_rate=1e6: losses 8.3, 8.3, 3e12, then
NaN), long enough for its states to be checkpointed and the sane ones rotated away. The rule
that catches it, here and nowhere else: a loss above EXPLOSION_FACTOR times the run's
reference loss is an explosion, the reference being the loss of the run's first step (its
initial state: an untrained model's loss; at least EXPLOSION_FLOOR), recorded in
`<workdir>/loss_reference.json` so that a resumed run judges by the same number. Since every
step's loss is checked, each committed checkpoint but the newest has had its loss checked by
the step after it; the newest is the dead end when that step's loss is the explosion.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import jax

from realformer_jax import atomic_files
from realformer_jax.train.errors import DivergenceError

# A loss this many times the run's first one is an explosion, not noise: an untrained model
# guesses uniformly, so even 10x its loss (e.g. 90 nats a predicted token at vocabulary 8k, or
# a mean squared error 10x that of predicting zero) is a model that has broken down.
EXPLOSION_FACTOR = 10.0
# The reference is at least this (in the task's loss units), so a first loss near 0 (an easy
# regression target) does not turn every later fluctuation into an "explosion".
EXPLOSION_FLOOR = 1.0
REFERENCE_FILE = 'loss_reference.json'


class LossReference:
  """The run's reference loss: read from the workdir, else the first loss recorded (written
  to the workdir by process 0 if that is step 1, the loss of the initial state). A resumed run
  (`resumed`) whose file is missing or damaged says so (`note`) and rebuilds it from its own
  first loss, recording that step: the rule then judges by that loss, not the initial one."""

  def __init__(self, workdir: str, resumed: bool = False):
    self.path = os.path.join(workdir, REFERENCE_FILE)
    self.loss: Optional[float] = None
    self.note: Optional[str] = None
    problem = None
    try:
      with open(self.path) as f:
        self.loss = float(json.load(f)['loss'])
      if not math.isfinite(self.loss):
        raise ValueError('not a finite loss')
    except FileNotFoundError:
      problem = 'is missing'
    except (OSError, ValueError, KeyError, TypeError) as e:
      self.loss, problem = None, f'is damaged ({type(e).__name__})'
    self._rebuild = resumed and problem is not None
    if self._rebuild:
      self.note = (
        f"note: {self.path} {problem}: the explosion rule judges by this run's first loss "
        "instead of the run's step-1 loss, recorded there again with its step"
      )

  def threshold(self, step: int, loss: float) -> float:
    """The explosion threshold for the finite `loss` of `step` (which may set the reference)."""
    if self.loss is None:
      self.loss = loss
      if (step == 1 or self._rebuild) and jax.process_index() == 0:
        record = {'step': step, 'loss': loss, 'rule': f'explosion above {EXPLOSION_FACTOR}x'}
        try:
          atomic_files.write_json(self.path, record, indent=None, sort_keys=False)
        except OSError:
          pass  # a full disk: this run still judges by it; the save reports the disk
    return EXPLOSION_FACTOR * max(self.loss, EXPLOSION_FLOOR)


def check_finite(
  step: int,
  loss: float,
  metrics: Any,
  last_checkpoint: Optional[int],
  reference: Optional[LossReference] = None,
) -> None:
  """Raises DivergenceError if step `step`'s `loss`, gradients (`metrics['grads_finite']`) or
  new state (`metrics['state_finite']`, train/step.py) are not finite, or if its loss exploded
  (above `reference`'s threshold). `last_checkpoint`: the newest step saved or restored, the one
  a rerun would resume from."""
  if not math.isfinite(loss):
    what, replayed = f'non-finite loss {loss}', True
  elif not bool(metrics['grads_finite']):
    what, replayed = 'non-finite gradients', True
  elif not bool(metrics['state_finite']):
    # e.g. an optimizer value that overflows: the loss and gradients were still finite
    what, replayed = 'non-finite parameters or optimizer state after the update', False
  elif reference is not None and loss > (limit := reference.threshold(step, loss)):
    what = (
      f"exploded loss {loss:.4g} (above {limit:.4g}: {EXPLOSION_FACTOR:g}x the run's first "
      f'loss {reference.loss:.4g}, {os.path.basename(reference.path)})'
    )
    replayed = True
  else:
    return
  raise divergence_error(what, step, replayed, last_checkpoint)


def check_final_eval(
  step: int, eval_loss: float, last_checkpoint: Optional[int], reference: LossReference
) -> None:
  """The final evaluation judges the state saved at the last step, which no later step's loss
  does: DivergenceError if its eval loss is not finite or exploded (the same rule, against the
  run's reference loss), naming that checkpoint as the dead end to set aside (when it was saved
  at `step`), so that neither a rerun nor an export takes it for a model."""
  if math.isfinite(eval_loss) and (
    reference.loss is None or eval_loss <= EXPLOSION_FACTOR * max(reference.loss, EXPLOSION_FLOOR)
  ):
    return
  what = (
    f'non-finite eval loss {eval_loss}'
    if not math.isfinite(eval_loss)
    else f"exploded eval loss {eval_loss:.4g} (above {EXPLOSION_FACTOR:g}x the run's first loss "
    f'{reference.loss:.4g}, {os.path.basename(reference.path)})'
  )
  if last_checkpoint == step:
    raise DivergenceError(
      f'{what} at the final evaluation of step {step}: the state saved at step {step} has diverged',
      step,
      dead_end=step,
    )
  kept = f'step {last_checkpoint}' if last_checkpoint is not None else 'none'
  raise DivergenceError(
    f'{what} at the final evaluation of step {step} (last good checkpoint: {kept})', step
  )


def divergence_error(
  what: str, step: int, replayed: bool, last_checkpoint: Optional[int]
) -> DivergenceError:
  if replayed and last_checkpoint is not None and last_checkpoint == step - 1:
    return DivergenceError(
      f'{what} at step {step}, right after the checkpoint at step {last_checkpoint}, which '
      "every resume would replay exactly (a step's loss and gradients depend only on the "
      'state, batch and key it restores); stopped without saving',
      step,
      dead_end=last_checkpoint,
    )
  kept = f'step {last_checkpoint}' if last_checkpoint is not None else 'none'
  return DivergenceError(
    f'{what} at step {step}; stopped without saving (last good checkpoint: {kept})', step
  )
