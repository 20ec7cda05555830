"""Kernel backends as plug-ins (realformer_jax/kernels/backends/): one folder, one record, one
registration, and every user of a backend asks the record.

The proof is a toy backend (tests/toy_backend/: the fused kernels' contract in plain jnp),
copied outside the repository and imported from there: a model runs through it, forward and
backward, and agrees with the einsum path; what its record says it cannot do is refused in one
line. Float32 matmuls at 'highest' (tests/conftest.py) on both sides.
"""

import importlib
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo_paths
from model_fixtures import kernel_fields

from realformer_jax import Encoder, ModelConfig, source_digest
from realformer_jax.analysis import check_cache
from realformer_jax.aot import categories
from realformer_jax.config import ConfigError
from realformer_jax.kernels import backends
from realformer_jax.kernels.plumbing import select

TOY = os.path.join(repo_paths.TESTS, 'toy_backend')
LENGTH = 16
SMALL = kernel_fields(LENGTH, attention_platform='cpu')


@pytest.fixture
def toy(tmp_path, monkeypatch):
  """The toy backend as a package of its own (`my_backend`), outside the repository."""
  shutil.copytree(TOY, tmp_path / 'my_backend', ignore=shutil.ignore_patterns('__pycache__'))
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    yield importlib.import_module('my_backend').BACKEND
  finally:
    backends.unregister('toy')
    for name in [m for m in sys.modules if m.split('.')[0] == 'my_backend']:
      del sys.modules[name]


def _loss_and_inputs(config: ModelConfig, abstract: bool = False):
  ids = jax.random.randint(jax.random.key(1), (2, LENGTH), 1, config.vocab_size)
  mask = jnp.ones((2, LENGTH), jnp.int32).at[1, 12:].set(0)  # one padded row
  init = Encoder(config.replace(attention_impl='xla')).init
  params = (jax.eval_shape if abstract else lambda f, *a: f(*a))(init, jax.random.key(0), ids, mask)
  weights = jnp.linspace(-1.0, 1.0, config.hidden_size)

  def loss(p):
    h = Encoder(config).apply(p, ids, mask)
    return jnp.sum(jnp.sin(h) * weights), h

  return jax.value_and_grad(loss, has_aux=True), params


def _outputs_and_grads(config: ModelConfig):
  loss_and_grads, params = _loss_and_inputs(config)
  (_, hidden), grads = jax.jit(loss_and_grads)(params)
  return hidden, grads


def _assert_close(got, want, tol):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=tol * float(np.abs(w).max()))


def test_a_model_traces_through_a_backend_registered_from_its_own_folder(toy):
  # Forward and backward traced (no compile) through the toy's kernels: the record is all the
  # rest of the repository needed. The numbers are checked in the slow test below.
  config = ModelConfig(**SMALL, attention_impl='toy_einsum')
  attention_plan = select.plan(config, LENGTH)
  assert (attention_plan.path, attention_plan.backend) == ('pallas', 'toy')
  assert attention_plan.kernels is toy
  assert 'my_backend.attention' not in sys.modules  # the record alone: kernels load on use
  loss_and_grads, params = _loss_and_inputs(config, abstract=True)
  (_, hidden), grads = jax.eval_shape(loss_and_grads, params)
  assert 'my_backend.attention' in sys.modules
  assert hidden.shape == (2, LENGTH, config.hidden_size)
  assert jax.tree.structure(grads) == jax.tree.structure(params)


@pytest.mark.slow  # compiles two encoders, forward and backward (~10 s on 2 idle cores)
@pytest.mark.parametrize(
  'overrides',
  [
    dict(ln_placement='realformer'),  # the carried sum as a sealed pair (rebuilt going down)
    dict(ln_placement='realformer', residual_scores_backward='recomputed'),  # sum_given
    dict(ln_placement='post'),
  ],
)
def test_a_model_through_a_registered_backend_matches_the_einsum_path(toy, overrides):
  config = ModelConfig(**{**SMALL, **overrides}, attention_impl='toy_einsum')
  got = _outputs_and_grads(config)
  _assert_close(got, _outputs_and_grads(config.replace(attention_impl='xla')), 1e-5)


def test_what_a_backend_record_does_not_support_is_refused_in_one_line(toy):
  del toy
  config = ModelConfig(**SMALL, attention_impl='toy_einsum')
  select.check(config)  # the name is known now
  with pytest.raises(ConfigError, match=r"'toy_einsum': the toy backend has no attention dropout"):
    select.check(config.replace(attention_dropout_rate=0.1))
  with pytest.raises(ConfigError, match="residual_carry='qk': the toy backend .* no qk kernels"):
    select.check(config.replace(residual_carry='qk'))
  with pytest.raises(ValueError, match="'toy' is already taken"):
    backends.register(backends.registry.get('toy'))


def test_an_unregistered_backend_name_is_refused_with_the_registered_ones():
  config = ModelConfig(**SMALL, attention_impl='toy_einsum')  # the form is all config checks
  with pytest.raises(
    ConfigError, match="'toy_einsum': must be one of auto, xla, pallas, pallas_tr"
  ):
    select.check(config)
  # A run refuses it while validating its config, before any data is built.
  from realformer_jax.train import default_config, validate_config  # pylint: disable=import-outside-toplevel

  run = default_config()
  run.model.attention_impl = 'toy_einsum'
  with pytest.raises(ConfigError, match="model.attention_impl='toy_einsum': must be one of"):
    validate_config(run)


@pytest.mark.parametrize(
  'impl,platform,want',
  [
    ('auto', 'cpu', None),
    ('auto', 'gpu', ('triton', False)),
    ('auto', 'tpu', ('mosaic', False)),
    ('pallas', 'cpu', ('triton', True)),
    ('pallas_triton', 'cpu', ('triton', True)),
    ('pallas_mosaic', 'cpu', ('mosaic', True)),
    ('pallas_mosaic', 'tpu', ('mosaic', False)),
    ('cudnn', 'gpu', ('cudnn', False)),
    ('pallas_triton', 'tpu', 'triton kernels do not run on tpu'),
    ('pallas_mosaic', 'gpu', 'mosaic kernels do not run on gpu'),
    ('cudnn', 'cpu', "'cudnn': needs a GPU"),
  ],
)
def test_the_platform_table_comes_from_the_records(impl, platform, want):
  # kernels/plumbing/select.py's table, row by row, as the built-in records give it.
  # Post-LN: plain attention, which every backend in the table has (cuDNN carries no sum).
  plain = {**SMALL, 'ln_placement': 'post'}
  config = ModelConfig(**plain, attention_impl=impl).replace(attention_platform=platform)
  if isinstance(want, str):
    with pytest.raises(ConfigError, match=want):
      select.plan(config, 512)
    return
  attention_plan = select.plan(config, 512)
  got = None if attention_plan is None else (attention_plan.backend, attention_plan.interpret)
  assert got == want


def test_tiles_and_head_padding_are_the_records():
  assert select.block_sizes('triton', 512, False) == (128, 64, 64)
  assert select.block_sizes('triton', 208, False) == (16, 16, 16)
  assert select.block_sizes('triton', 100, False) is None
  assert select.block_sizes('mosaic', 4096, False) == (256, 512, 256)
  assert select.block_sizes('mosaic', 384, False) == (128, 128, 128)
  assert select.block_sizes('mosaic', 200, False) == (200, 200, 200)
  assert backends.get('triton').head_dim(48) == 64 and backends.get('mosaic').head_dim(48) == 48
  for backend in backends.registered():  # the device check's odd length takes smaller tiles
    if backend.odd_length:
      assert backend.tiles(backend.odd_length, False) != backend.tiles(4096, False)


def test_compiled_hlo_categories_ask_the_records():
  facts = dict(
    opcodes=frozenset({'custom-call'}),
    matmul_flops=0.0,
    is_collective=False,
    arrays=(),
    source_files=frozenset(),
  )
  for target in ('__gpu$xla.gpu.triton', 'tpu_custom_call', '__cudnn$fmhaSoftmaxBackward'):
    kernel = categories.KernelFacts(custom_call_target=target, **facts)
    assert categories.categorize(kernel) == categories.ATTENTION
  unknown = categories.KernelFacts(custom_call_target='__toy$attention', **facts)
  assert categories.categorize(unknown) != categories.ATTENTION
  backends.register(
    backends.Backend('hlo_toy', 'hlo_toy', 'gpu', 'nowhere', hlo_calls=('__toy$attention',))
  )
  try:
    assert categories.categorize(unknown) == categories.ATTENTION
  finally:
    backends.unregister('hlo_toy')


def test_the_self_checks_cache_key_covers_a_backend_outside_the_package(toy, tmp_path):
  # A verdict cached for the toy's kernels is not reused once its code changes.
  del toy
  before = check_cache.kernel_source_hash('toy_einsum')
  assert before != check_cache.kernel_source_hash()  # its folder is hashed too
  with open(tmp_path / 'my_backend' / 'attention.py', 'a') as f:
    f.write('\n# changed\n')
  source_digest.folder_digest.cache_clear()  # a process caches each folder's digest
  assert check_cache.kernel_source_hash('toy_einsum') != before
