"""model.scan_unroll: 'auto' unrolls the layer scan on a GPU where the compile fits, rolled
elsewhere (model/layer_unroll.py); the field's validation; the scan the encoder really builds.
Deviceless and compile-free: the rule reads the config, the encoder is only traced."""

import jax
import pytest
from model_fixtures import padded_batch, tiny_config

from realformer_jax import MaskedLM
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.finetune.config import default_model_config as finetune_model_config
from realformer_jax.model import layer_unroll
from realformer_jax.train.config import default_model_config

LARGE = dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096, max_len=512)


def _choice(**fields) -> layer_unroll.UnrollChoice:
  return layer_unroll.choose(ModelConfig(**{**LARGE, **fields}))


def test_auto_unrolls_bert_large_fully_on_a_gpu_and_says_what_the_compile_costs():
  choice = _choice(attention_platform='gpu')
  assert choice.layers_per_iteration == 24
  assert 'compile ~229 s estimated on 2 CPU cores (rolled ~58 s)' in choice.reason


@pytest.mark.parametrize(
  'fields, why',
  [
    (dict(attention_platform='cpu'), 'on cpu unrolling pays only on a GPU'),
    (dict(attention_platform='tpu'), 'on tpu unrolling pays only on a GPU'),
    # The tests' own process: 'auto' platform is this host's CPU.
    (dict(), 'on cpu unrolling pays only on a GPU'),
    (dict(attention_platform='gpu', num_layers=48), '~407 s on 2 CPU cores, over the 240 s'),
    (dict(attention_platform='gpu', max_len=65536), 'model.max_len=65536 > 4096'),
  ],
)
def test_auto_keeps_the_scan_rolled_where_unrolling_does_not_pay(fields, why):
  choice = _choice(**fields)
  assert choice.layers_per_iteration == 1
  assert why in choice.reason


def test_an_explicit_unroll_is_kept_on_every_platform():
  assert _choice(attention_platform='cpu', scan_unroll=24).layers_per_iteration == 24
  assert _choice(attention_platform='gpu', scan_unroll=1).layers_per_iteration == 1
  assert _choice(attention_platform='gpu', scan_unroll=6).reason == 'set in the config'


def test_the_compile_estimate_is_the_measured_rolled_and_unrolled_bert_large():
  assert layer_unroll.unrolled_compile_s(1) == layer_unroll.ROLLED_COMPILE_S == 58.0
  assert layer_unroll.unrolled_compile_s(24) == pytest.approx(229.0)


def test_scan_unroll_validation():
  assert ModelConfig().scan_unroll == 'auto'
  assert ModelConfig(scan_unroll='12').scan_unroll == 12  # from the command line
  cases = {
    0: "model.scan_unroll=0: must be a positive integer dividing model.num_layers or 'auto'",
    'all': "model.scan_unroll='all': must be a positive integer dividing model.num_layers or",
    True: 'model.scan_unroll=True: must be a positive integer',
    5: 'model.scan_unroll=5: must divide model.num_layers=12',
  }
  for value, message in cases.items():
    with pytest.raises(ConfigError) as raised:
      ModelConfig(scan_unroll=value)
    assert str(raised.value).startswith(message)


def test_the_config_section_takes_an_integer_or_auto():
  section = default_model_config()
  assert section.scan_unroll == 'auto'
  section.scan_unroll = 12  # what configs/bert.py does: no type error from ConfigDict
  assert ModelConfig.from_mapping(section).scan_unroll == 12
  section.scan_unroll = 'auto'
  assert ModelConfig.from_mapping(section).scan_unroll == 'auto'
  placeholders = finetune_model_config()  # None: the starting checkpoint's
  placeholders.scan_unroll = 12
  placeholders.scan_unroll = 'auto'


def _traced_unroll(config: ModelConfig) -> int:
  """The `unroll` of the layer scan in the traced forward (tracing only: nothing compiles)."""
  ids, mask, segments = padded_batch(length=config.max_len, real_lengths=(24, 10))
  model = MaskedLM(config)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask, segments))
  jaxpr = jax.make_jaxpr(lambda v: model.apply(v, ids, mask, segments))(variables)
  unrolls = [e.params['unroll'] for e in jaxpr.jaxpr.eqns if e.primitive.name == 'scan']
  assert len(unrolls) == 1, unrolls
  return unrolls[0]


def test_the_encoder_scans_with_the_resolved_unroll():
  # attention_impl='xla': the einsum path, so a 'gpu' platform traces on this CPU host.
  rolled = tiny_config(attention_impl='xla')
  assert _traced_unroll(rolled) == 1  # 'auto' on this CPU
  assert _traced_unroll(rolled.replace(attention_platform='gpu')) == 3  # all 3 layers
