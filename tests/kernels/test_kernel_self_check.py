"""Kernels prove themselves before a run trusts them (realformer_jax/analysis/kernel_check.py).

On a GPU / TPU the train setup checks the compiled kernel it is about to use against the einsum
path. Here (CPU) the check is forced onto the interpret-mode kernels: one real comparison, then
a kernel made to give a wrong result or to raise (the probe runner replaced) falls back to the
einsum path with one warning line under 'auto', and stops with one ConfigError line under an
explicit 'pallas'. Float32 matmuls (tests/conftest.py; the check itself runs at 'highest').
"""

import types

import jax
import jax.numpy as jnp
import pytest
from model_fixtures import kernel_fields

from realformer_jax import ModelConfig
from realformer_jax.analysis import kernel_check
from realformer_jax.config import ConfigError
from realformer_jax.kernels.plumbing import select
from realformer_jax.train import build, default_config, pretraining

SMALL = kernel_fields(32, attention_dropout_rate=0.2)
CPU = jax.devices()[:1]


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv('REALFORMER_JAX_CACHE', str(tmp_path / 'cache'))
  monkeypatch.setattr(kernel_check, '_verdicts', {})
  # On CPU a run never checks (interpret mode): force the check onto the interpret kernels.
  monkeypatch.setattr(kernel_check, '_kernel_to_check', lambda attention_plan, devices: _FORCED)


# The plan the forced checks prove: the interpret-mode kernels at length 32.
_FORCED = select.plan(ModelConfig(**SMALL).replace(attention_impl='pallas'), 32)


def _broken(monkeypatch, kernel):
  """run_probe faked: the einsum side gives fixed (hidden, grads), the kernel side
  `kernel(hidden, grads)` of them; counts calls."""
  calls = []
  hidden = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
  grads = {'dense': {'kernel': jnp.cos(jnp.arange(6.0))}, 'norm': {'scale': jnp.ones(4)}}

  def run_probe(probe, problem):
    calls.append(probe.attention_impl)
    return (hidden, grads) if probe.attention_impl == 'xla' else kernel(hidden, grads)

  monkeypatch.setattr(kernel_check, 'run_probe', run_probe)
  # The fake ignores the probe's inputs: skip building them (an eager Encoder init, 3-4 s CPU).
  monkeypatch.setattr(kernel_check, '_problem', lambda probe, length: None)
  return calls


@pytest.mark.slow
def test_the_interpret_kernels_pass_their_own_check():
  cfg = ModelConfig(**SMALL)
  assert kernel_check.fallback(cfg, _FORCED, CPU) == {}
  (verdict,) = kernel_check._verdicts.values()  # pylint: disable=protected-access
  assert verdict.ok and verdict.worst <= 1e-5, verdict  # measured ~3e-7


def test_a_wrong_kernel_result_falls_back_to_the_einsum_path(monkeypatch, capsys):
  calls = _broken(monkeypatch, lambda h, g: (h * 1.1, g))
  cfg = ModelConfig(**SMALL)
  fallback = kernel_check.fallback(cfg, _FORCED, CPU)
  assert fallback == {'attention_impl': 'xla'}
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('warning: the triton attention kernels'), lines
  assert 'worst relative error 1.0e-01' in lines[0] and "attention_impl='xla'" in lines[0]
  # The verdict is cached: a second setup (e.g. an accumulation probe) does not check again,
  # nor does a new process (the disk cache), which still warns.
  assert kernel_check.fallback(cfg, _FORCED, CPU) == fallback
  monkeypatch.setattr(kernel_check, '_verdicts', {})
  assert kernel_check.fallback(cfg, _FORCED, CPU) == fallback
  assert calls == ['xla', 'pallas_triton']
  assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_a_kernel_that_raises_falls_back_and_says_why(monkeypatch, capsys):
  def kernel(hidden, grads):
    raise RuntimeError('Mosaic failed to compile\nlong compiler log')

  _broken(monkeypatch, kernel)
  cfg = ModelConfig(**{**SMALL, 'ln_placement': 'post'})
  assert kernel_check.fallback(cfg, _FORCED, CPU) == {'attention_impl': 'xla'}
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert 'failed to compile or run (RuntimeError: Mosaic failed to compile)' in line


def test_non_finite_kernel_gradients_fail_the_check(monkeypatch):
  _broken(monkeypatch, lambda h, g: (h, jax.tree.map(lambda x: x * jnp.nan, g)))
  assert kernel_check.fallback(ModelConfig(**SMALL), _FORCED, CPU) == {'attention_impl': 'xla'}


def test_an_explicit_kernel_that_fails_stops_in_one_line(monkeypatch, capsys):
  _broken(monkeypatch, lambda h, g: (h * 2, g))
  cfg = ModelConfig(**SMALL).replace(attention_impl='pallas')
  with pytest.raises(ConfigError) as error:
    kernel_check.fallback(cfg, _FORCED, CPU)
  message = str(error.value)
  assert '\n' not in message and message.startswith("model.attention_impl='pallas': the triton")
  assert capsys.readouterr().err == ''


def test_attention_check_false_skips_it(monkeypatch):
  calls = _broken(monkeypatch, lambda h, g: (h * 2, g))
  cfg = ModelConfig(**SMALL).replace(attention_check=False)
  assert kernel_check.fallback(cfg, _FORCED, CPU) == {} and calls == []
  with pytest.raises(ConfigError, match="model.attention_check='no': must be True or False"):
    ModelConfig(attention_check='no')


def test_the_train_setup_builds_its_model_from_the_checked_config(monkeypatch, capsys):
  _broken(monkeypatch, lambda h, g: (h * 2, g))
  config = default_config()
  config.model.update(SMALL)
  config.data.max_len = 32
  setup = build.make_setup(pretraining.validate_config(config))
  assert setup.model.config.attention_impl == 'xla'
  assert 'warning: the triton attention kernels failed their check' in capsys.readouterr().err


def test_a_deviceless_compile_and_the_cpu_are_never_checked(monkeypatch):
  monkeypatch.undo()  # the real _kernel_to_check
  gpu = ModelConfig(attention_platform='gpu')
  topology_device = types.SimpleNamespace(platform='gpu', device_kind='H100')
  gpu_plan = select.plan(gpu, 512)
  assert gpu_plan.path == 'pallas' and not gpu_plan.interpret
  assert kernel_check._kernel_to_check(gpu_plan, [topology_device]) is None  # pylint: disable=protected-access
  cpu = ModelConfig(attention_platform='cpu', attention_impl='pallas')
  assert kernel_check._kernel_to_check(select.plan(cpu, 512), CPU) is None  # pylint: disable=protected-access


def test_the_train_setup_plans_the_checked_kernel_once():
  # select.for_run hands the self-check the plan the run takes (no second planning in
  # analysis/); none where nothing is checked: a ring (no kernel), attention_check=False.
  gpu = [types.SimpleNamespace(platform='gpu', device_kind='H100')]
  config = ModelConfig(**SMALL)
  attention = select.for_run(config, gpu, 512, memory_bytes=2**34)
  assert attention.changes['attention_platform'] == 'gpu'
  assert attention.plan == select.plan(config.replace(**attention.changes), 512)
  assert attention.plan.backend == 'triton' and not attention.plan.interpret
  assert select.for_run(config, gpu, 512, 2**34, sequence_shards=2).plan is None
  assert select.for_run(config.replace(attention_check=False), gpu, 512, 2**34).plan is None
