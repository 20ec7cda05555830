"""model.residual_carry='auto' (kernels/plumbing/select.py): the fastest carry that fits: the saved
sum, then the recomputed one, then the stacked queries and keys, but those only where a fused
kernel serves the platform and length; decided once when the train setup is built, against the
budget it is given (a target's in a deviceless compile)."""

import logging
import types

import pytest
from train_fixtures import tiny_config

from realformer_jax import train as train_lib
from realformer_jax.config import ModelConfig
from realformer_jax.kernels.plumbing import select
from realformer_jax.train import build
from realformer_jax.units import GiB

BASE = ModelConfig(ln_placement='realformer')  # BERT-Base: 12 layers, 12 heads
LARGE = ModelConfig(hidden_size=1024, num_heads=16, num_layers=24, ln_placement='realformer')
H100_BUDGET = int(53.39 * GiB)  # experiments.compile's budget for h100:1


def test_the_sums_of_one_sequence_follow_the_backward_that_holds_them():
  # 'saved': every layer's sum plus the carry and its gradient; 'recomputed': two.
  one_sum = 4 * 12 * 16384**2  # float32 [12, 16384, 16384]: 12 GiB
  assert select.scores_carry_bytes(BASE, 16384) == 14 * one_sum
  recomputed = BASE.replace(residual_scores_backward='recomputed')
  assert select.scores_carry_bytes(recomputed, 16384) == 2 * one_sum


# 'qk' needs a fused kernel: the GPU's Triton kernels (a config resolved for a GPU, as the
# train setup resolves it for a mesh or a deviceless target).
GPU = dict(attention_platform='gpu')


def test_auto_prefers_the_saved_sum_then_the_recomputed_one_then_qk(caplog, monkeypatch):
  choose = select.choose
  base, large = BASE.replace(**GPU), LARGE.replace(**GPU)
  with caplog.at_level(logging.INFO, logger=select.__name__):
    # BERT-Large at 512 (26 sums of 16 MiB per sequence): the saved sum, the fastest.
    assert choose(large, 512, H100_BUDGET)[:2] == ('scores', 'saved')
    # BERT-Base at 16k: 168 GiB saved does not fit, 24 GiB recomputed does (x1.29 the
    # attention FLOPs against qk's x4.1).
    choice = choose(base, 16384, H100_BUDGET)
    assert choice[:2] == ('scores', 'recomputed')
    assert 'x1.29' in choice.reason and 'x4.1' in choice.reason
    # At 32k even two sums (96 GiB) outgrow an 80 GB GPU: the Triton kernels' qk.
    choice = choose(base, 32768, H100_BUDGET)
    assert choice[:2] == ('qk', 'saved') and 'triton kernels' in choice.reason
    # The train setup's entry point logs it.
    assert select.resolve_residual_carry(base, 32768, H100_BUDGET) == 'qk'
  assert "-> 'qk'" in caplog.text and '53.4 GiB' in caplog.text
  # A configured 'recomputed' is kept; without a layer scan there is no recomputed stack.
  recomputed = base.replace(residual_scores_backward='recomputed')
  assert choose(recomputed, 16384, H100_BUDGET)[:2] == ('scores', 'recomputed')
  unscanned = base.replace(scan_layers=False)
  assert choose(unscanned, 16384, H100_BUDGET)[:2] == ('qk', 'saved')
  # A device that reports no memory (a CPU) keeps the sum; an explicit carry is never changed.
  monkeypatch.setattr(select, 'device_memory_bytes', lambda: None)
  assert choose(base, 65536).carry == 'scores'
  monkeypatch.setattr(select, 'device_memory_bytes', lambda: 80 * 10**9)
  assert choose(base, 65536).carry == 'qk'  # no budget given: the first local device's limit
  assert choose(base.replace(residual_carry='scores'), 65536, 1).carry == 'scores'
  assert choose(base.replace(residual_carry='qk'), 8, H100_BUDGET).carry == 'qk'


def test_auto_takes_qk_only_where_a_fused_kernel_serves_the_platform_and_length():
  # On the einsum path qk materialises the same scores: no memory saved, ~4x the FLOPs. So
  # with attention_impl='xla', on a CPU, or at a length the Triton kernels cannot tile, the
  # smallest sum stays even where it does not fit, and the reason says so.
  for config, length in (
    (BASE.replace(attention_impl='xla', **GPU), 32768),
    (BASE.replace(attention_platform='cpu'), 32768),
    (BASE.replace(**GPU), 32760),  # not a multiple of 16
  ):
    assert select.fused_kernel(config, length) is None
    choice = select.choose(config, length, H100_BUDGET)
    assert choice[:2] == ('scores', 'recomputed'), config
    assert 'no fused kernel' in choice.reason and "'qk' on the einsum path" in choice.reason
  # TPU: the Mosaic kernels.
  tpu = BASE.replace(attention_platform='tpu')
  assert select.fused_kernel(tpu, 32768) == 'mosaic'
  assert select.choose(tpu, 32768, H100_BUDGET).carry == 'qk'


def test_the_flops_factors_are_the_documented_counts():
  # Per score element: 14 K saved, 18 K recomputed, sum_l (14 + 8 l) K / 12 layers for qk.
  assert select.attention_flops_factor(BASE, 'recomputed') == pytest.approx(18 / 14)
  assert select.attention_flops_factor(BASE, 'qk') == pytest.approx(696 / 168)


def test_the_train_setup_decides_once_against_its_budget_and_keeps_auto_in_the_spec():
  spec = train_lib.validate_config(tiny_config(model__ln_placement='realformer'))
  assert spec.model.residual_carry == 'auto'
  roomy = build.make_setup(spec, memory_bytes=GiB)
  assert roomy.model_config.residual_carry == 'scores'
  # A budget smaller than one sequence's sums, but no fused kernel on this CPU: qk would save
  # nothing, so the smallest sum.
  tight = build.make_setup(spec, memory_bytes=1024)
  assert tight.model_config.residual_carry == 'scores'
  assert tight.model_config.residual_scores_backward == 'recomputed'
  assert tight.spec.model.residual_carry == 'auto'  # a resumed run decides on its devices
  # With the Pallas kernels (interpreted on a CPU): the stacked queries and keys.
  pallas = tight.model_config.replace(
    attention_impl='pallas', residual_carry='auto', residual_scores_backward='saved'
  )
  assert select.resolved(pallas, 16, 1024).residual_carry == 'qk'
  post = train_lib.validate_config(tiny_config(model__ln_placement='post'))
  assert build.make_setup(post, memory_bytes=1024).model_config.residual_carry == 'auto'


def test_every_task_decides_at_the_longest_sequence_its_model_reads():
  """build.make_setup decides the carry at `task.sequence_length`: the token ids' length of
  the longest batch, whatever the task names its arrays (translation's are `source`)."""
  # pylint: disable=import-outside-toplevel
  from realformer_jax.data import DataConfig
  from realformer_jax.mlm.task import MaskedLMTask
  from realformer_jax.seq2seq import task as translation
  from realformer_jax.seq2seq.config import default_translation_config

  assert MaskedLMTask().sequence_length(DataConfig(max_len=96)) == 96
  config = default_translation_config()
  config.model.update(ln_placement='realformer', init='bert', hidden_size=32, mlp_dim=64)
  config.model.update(num_heads=2, num_layers=1, num_decoder_layers=1)
  config.data.update(bucket_lengths=(16, 48), tokens_per_batch=96, vocab_size=300)
  spec = translation.validate(config)
  assert spec.task.sequence_length(spec.data) == 48
  tight = build.make_setup(spec, memory_bytes=1024)
  assert (tight.model_config.residual_carry, tight.model_config.residual_scores_backward) == (
    'scores',
    'recomputed',
  )


def test_a_run_decides_the_carry_for_its_devices_platform_not_this_hosts():
  # A deviceless compile for TPUs on a CPU host: for_run reads the platform it decided (the
  # devices') when it decides the carry, before anything is applied; the caller applies both.
  tpu_devices = [types.SimpleNamespace(platform='tpu', device_kind='TPU v5 lite')]
  attention = select.for_run(BASE, tpu_devices, 32768, H100_BUDGET)
  assert attention.changes['attention_platform'] == 'tpu'
  assert attention.changes['residual_carry'] == 'qk'  # the Mosaic kernels serve this length
  assert BASE.attention_platform == 'auto' and BASE.residual_carry == 'auto'  # left as given
  decided = BASE.replace(**attention.changes)
  assert attention.plan == select.plan(decided, 32768) and attention.plan.backend == 'mosaic'
