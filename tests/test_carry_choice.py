"""model.residual_carry='auto' (kernels/carry_choice.py): the carried sum while one sequence's
sums fit the device, the stacked queries and keys where they do not; decided once when the
train setup is built, against the budget it is given (a target's in a deviceless compile)."""

import logging

from train_fixtures import tiny_config

from realformer_jax import train as train_lib
from realformer_jax.config import ModelConfig
from realformer_jax.kernels import carry_choice
from realformer_jax.train import build
from realformer_jax.units import GiB

BASE = ModelConfig(ln_placement='realformer')  # BERT-Base: 12 layers, 12 heads
LARGE = ModelConfig(hidden_size=1024, num_heads=16, num_layers=24, ln_placement='realformer')
H100_BUDGET = int(53.39 * GiB)  # experiments.compile's budget for h100:1


def test_the_sums_of_one_sequence_follow_the_backward_that_holds_them():
  # 'saved': every layer's sum plus the carry and its gradient; 'recomputed': two.
  one_sum = 4 * 12 * 16384**2  # float32 [12, 16384, 16384]: 12 GiB
  assert carry_choice.scores_carry_bytes(BASE, 16384) == 14 * one_sum
  recomputed = BASE.replace(residual_scores_backward='recomputed')
  assert carry_choice.scores_carry_bytes(recomputed, 16384) == 2 * one_sum


def test_auto_keeps_the_sum_where_it_fits_and_carries_qk_where_it_cannot(caplog, monkeypatch):
  choose = carry_choice.resolve_residual_carry
  with caplog.at_level(logging.INFO, logger=carry_choice.__name__):
    # BERT-Large at 512 (26 sums of 16 MiB per sequence): today's carry, as before.
    assert choose(LARGE, 512, H100_BUDGET) == 'scores'
    # BERT-Base at 16k: 168 GiB saved does not fit, 24 GiB recomputed does.
    assert choose(BASE, 16384, H100_BUDGET) == 'qk'
    assert choose(BASE.replace(residual_scores_backward='recomputed'), 16384, H100_BUDGET) == (
      'scores'
    )
    # At 32k even two sums (96 GiB) outgrow an 80 GB GPU.
    recomputed = BASE.replace(residual_scores_backward='recomputed')
    assert choose(recomputed, 32768, H100_BUDGET) == 'qk'
  assert "-> 'qk'" in caplog.text and '53.4 GiB' in caplog.text
  # A device that reports no memory (a CPU) keeps the sum; an explicit carry is never changed.
  monkeypatch.setattr(carry_choice, 'device_memory_bytes', lambda: None)
  assert choose(BASE, 65536) == 'scores'
  monkeypatch.setattr(carry_choice, 'device_memory_bytes', lambda: 80 * 10**9)
  assert choose(BASE, 65536) == 'qk'  # no budget given: the first local device's limit
  assert choose(BASE.replace(residual_carry='scores'), 65536, 1) == 'scores'
  assert choose(BASE.replace(residual_carry='qk'), 8, H100_BUDGET) == 'qk'


def test_the_train_setup_decides_once_against_its_budget_and_keeps_auto_in_the_spec():
  spec = train_lib.validate_config(tiny_config(model__ln_placement='realformer'))
  assert spec.model.residual_carry == 'auto'
  roomy = build.make_setup(spec, memory_bytes=GiB)
  assert roomy.model_config.residual_carry == 'scores'
  # A budget smaller than one sequence's sums: the stacked queries and keys.
  tight = build.make_setup(spec, memory_bytes=1024)
  assert tight.model_config.residual_carry == 'qk' and tight.model.config.residual_carry == 'qk'
  assert tight.spec.model.residual_carry == 'auto'  # a resumed run decides on its devices
  post = train_lib.validate_config(tiny_config(model__ln_placement='post'))
  assert build.make_setup(post, memory_bytes=1024).model_config.residual_carry == 'auto'
