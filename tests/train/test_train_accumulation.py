"""train.grad_accum_steps='auto': the choice equals a hand calculation from each candidate's
compiled memory_analysis, the chosen step is bit-identical to the explicit value, and a batch
that cannot fit fails in one line naming the bytes."""

import jax
import numpy as np
import pytest
from train_fixtures import synthetic_batch, tiny_config

from realformer_jax import train
from realformer_jax.config import ConfigError
from realformer_jax.train import build, memory

_COMPILED = {}


@pytest.fixture(autouse=True)
def compile_each_config_once(monkeypatch):
  """The same config compiles to the same program: reuse it across the hand calculations and
  the searches of this module (compilation dominates these tests)."""
  real = build.compile_train_step

  def cached(setup):
    # What the program depends on (not, e.g., the memory budget the search was given).
    spec = setup.spec
    key = (spec.model, spec.data, spec.train.grad_accum_steps, spec.train.global_batch_size)
    if key not in _COMPILED:
      _COMPILED[key] = real(setup)
    return _COMPILED[key]

  monkeypatch.setattr(build, 'compile_train_step', cached)


def _need_by_hand(config, accum):
  m = train.compile_train_step(
    tiny_config(**config, train__grad_accum_steps=accum)
  ).memory_analysis()
  # Live inputs + outputs, the donated state (aliased outputs) counted once, + temporaries.
  return (
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


_BASE = dict(model__dropout_rate=0.1, train__global_batch_size=8, model__remat_policy='none')


def _resolve(budget, **overrides):
  config = tiny_config(
    **_BASE,
    train__grad_accum_steps='auto',
    train__device_memory_bytes=budget,
    train__memory_fraction=1.0,
    **overrides,
  )
  lines = []
  spec = train.validate_config(config)
  return build.resolve(spec, memory.memory_budget(spec.train), log=lines.append), lines


@pytest.mark.slow
def test_auto_picks_the_smallest_accumulation_that_fits_and_matches_the_explicit_step(monkeypatch):
  needs = {a: _need_by_hand(_BASE, a) for a in (1, 2, 4, 8)}
  # The hand calculation: the smallest A whose step fits.
  by_hand = lambda budget: min(a for a, need in needs.items() if need <= budget)
  budget = (needs[2] + needs[4]) // 2
  assert by_hand(budget) == 4, needs
  resolved, lines = _resolve(budget)
  assert resolved.spec.train.grad_accum_steps == 4
  assert resolved.need_bytes == needs[4] and resolved.budget_bytes == budget
  assert "4 microbatch(es) of 2 sequence(s) per device, remat_policy='none'" in lines[-1]
  for exact in (needs[1], needs[8]):  # exactly enough memory
    assert _resolve(exact)[0].spec.train.grad_accum_steps == by_hand(exact)

  # The chosen step is the explicit A=4 step: same numbers, bit for bit. The explicit step is
  # compiled afresh (not taken from this module's cache, which would hand back the very program
  # the search chose and compare it with itself).
  monkeypatch.undo()
  explicit_config = tiny_config(**_BASE, train__grad_accum_steps=4)
  explicit = train.compile_train_step(explicit_config)
  assert explicit is not resolved.compiled
  setup = resolved.setup
  key = jax.random.key(0)
  batch = build.global_batch(synthetic_batch(explicit_config), setup.batch_sharding)
  results = []
  for step in (resolved.compiled, explicit):
    state = setup.init_state(key)
    results.append(jax.device_get(step(state, batch, jax.device_put(key, setup.replicated))))
  jax.tree.map(np.testing.assert_array_equal, results[0], results[1])


@pytest.mark.slow
def test_auto_fails_in_one_line_when_one_sequence_cannot_fit():
  with pytest.raises(ConfigError) as error:
    _resolve(1_000)
  message = str(error.value)
  assert '\n' not in message
  assert 'even one sequence per device does not fit' in message
  assert (
    "remat_policy='full'" in message
    and 'the device has 1,000 (train.device_memory_bytes' in message
  )


@pytest.mark.slow
def test_auto_tries_full_remat_before_giving_up():
  needs_none = _need_by_hand(_BASE, 8)
  needs_full = _need_by_hand(dict(_BASE, model__remat_policy='full'), 8)
  if needs_full >= needs_none:
    pytest.skip(f'full remat saves nothing at this size ({needs_full} vs {needs_none} bytes)')
  resolved, lines = _resolve((needs_none + needs_full) // 2)
  assert resolved.spec.model.remat_policy == 'full'
  assert any("trying 'full'" in line for line in lines)


def test_accumulation_values_are_checked_before_compilation():
  with pytest.raises(
    ConfigError,
    match=r"train.grad_accum_steps='some': must be a positive "
    r"integer or 'auto'",
  ):
    train.validate_config(tiny_config(train__grad_accum_steps='some'))
  config = tiny_config(train__grad_accum_steps='4')  # as the command line delivers it
  assert train.validate_config(config).train.grad_accum_steps == 4
  assert config.train.grad_accum_steps == '4'  # the user's config is read, never written
  with pytest.raises(ConfigError, match='train.memory_fraction=1.5'):
    train.validate_config(tiny_config(train__memory_fraction=1.5))
