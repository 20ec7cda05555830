"""Token ids outside the vocabulary (issue 59): a gather out of range embeds as NaN, silently.
An eager call refuses them in one ValueError naming the id and where it is; under jit,
model.check_token_ids=True makes the step raise with the same message; without it the NaN is
the documented outcome (docs/training.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.config import ModelConfig
from realformer_jax.model.encoder import Encoder

# float32 throughout (conftest pins matmul precision 'highest'); nothing here compares numbers.
_CONFIG = ModelConfig(
  vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32, max_len=8
)
_BAD = jnp.array([[1, 2, 50, 4], [5, 6, 7, -1]])
_MESSAGE = (
  r'^input_ids\[0, 2\] = 50: outside the vocabulary \[0, 50\) \(model\.vocab_size; 2 such '
  r'id\(s\)\); an embedding lookup there gives NaN'
)


@pytest.fixture(scope='module')
def params():
  return Encoder(_CONFIG).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))


def test_an_eager_call_refuses_ids_outside_the_vocabulary(params):
  with pytest.raises(ValueError, match=_MESSAGE):
    Encoder(_CONFIG).apply(params, _BAD)
  assert np.isfinite(Encoder(_CONFIG).apply(params, _BAD % 50)).all()


def test_under_jit_the_debug_flag_raises_and_without_it_the_ids_give_nan(params):
  checked = jax.jit(Encoder(_CONFIG.replace(check_token_ids=True)).apply)
  with pytest.raises(Exception, match=r'input_ids\[0, 2\] = 50: outside the vocabulary'):
    checked(params, _BAD).block_until_ready()
  assert np.isfinite(checked(params, _BAD % 50)).all()  # valid ids pass the check
  # Unchecked, the NaN of one id spreads through attention to its whole sequence.
  unchecked = jax.jit(Encoder(_CONFIG).apply)(params, _BAD)
  assert np.isnan(unchecked[0]).all()


def test_a_negative_id_gives_what_an_id_past_the_vocabulary_gives(params):
  """Both NaN under jit (a negative id wrapped to the last row before), both refused eagerly."""
  negative = jnp.array([[1, 2, 3, -1]])
  past = jnp.array([[1, 2, 3, 50]])
  for ids in (negative, past):
    assert np.isnan(jax.jit(Encoder(_CONFIG).apply)(params, ids)).all()
    with pytest.raises(ValueError, match=r'outside the vocabulary \[0, 50\)'):
      Encoder(_CONFIG).apply(params, ids)
