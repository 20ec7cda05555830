"""model.remat_dropout_masks='auto' (kernels/dropout/remat_masks.py): the cheapest of 'stored',
'per_layer' and 'drawn' that fits the device beside the program, decided by arithmetic (no
compile)."""

import pytest

from realformer_jax.aot import targets
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.dropout import remat_masks
from realformer_jax.kernels.plumbing import select

BASE = ModelConfig(remat_policy='full', attention_dropout_rate=0.1, dtype='bfloat16')


def _usable(chip: str) -> int:
  return targets.CHIPS[chip].usable_memory_bytes  # JAX's 75 % of the GPU, as on the device


def test_bert_base_65k_stores_its_masks_on_an_h200_and_passes_per_layer_on_an_h100():
  # issue 64: at L = 65,536 the masks (72 GiB) fit an H200 beside the ~12 GiB program, not an
  # H100, where one layer's (6 GiB) does: the per-layer pass, cheaper than drawing in both
  # backward loops; 'drawn' only where not even one layer's mask fits. Whatever share of the
  # memory the masks are.
  config = BASE.replace(max_len=65536)
  assert remat_masks.dropout_masks_bytes(config, 65536) == 12 * 12 * 65536**2 // 8  # 72 GiB
  assert 11 * 2**30 < remat_masks.program_bytes(config, 65536) < 14 * 2**30  # 12.3 measured
  assert remat_masks.cost('stored') < remat_masks.cost('per_layer') < remat_masks.cost('drawn')
  h200 = select.choose_masks(config, 65536, _usable('h200'))
  assert h200.masks == 'stored', h200.reason
  h100 = select.choose_masks(config, 65536, _usable('h100'))
  assert h100.masks == 'per_layer', h100.reason
  assert '72.0 GiB' in h100.reason and 'does not fit' in h100.reason
  # A device with room for the program but not for one layer's mask beside it: drawn.
  program = remat_masks.program_bytes(config, 65536)
  assert select.choose_masks(config, 65536, int(program / 0.9) + 2**30).masks == 'drawn'
  # Far above the old fixed share (25 %): 32k's 18 GiB of masks are stored on an H100 too.
  assert select.choose_masks(BASE.replace(max_len=32768), 32768, _usable('h100')).masks == 'stored'
  # No limit reported: drawn; an explicit choice is kept.
  assert select.choose_masks(config, 65536, None).masks == 'drawn'
  explicit = config.replace(remat_dropout_masks='stored')
  assert select.choose_masks(explicit, 65536, _usable('h100')).masks == 'stored'


def test_the_choice_is_decided_once_for_a_run_and_logged(caplog):
  h100 = _usable('h100')
  with caplog.at_level('INFO'):
    run = select.resolved(BASE.replace(max_len=65536), 65536, h100)
  assert run.remat_dropout_masks == 'per_layer'
  assert "model.remat_dropout_masks='auto' -> 'per_layer'" in caplog.text
  # Where the masks change nothing, left alone.
  for unaffected in (BASE.replace(remat_policy='none'), BASE.replace(ln_placement='realformer')):
    assert select.resolved(unaffected, 65536, h100).remat_dropout_masks == 'auto'
  # The plan follows the config: the kernels keep the masks only where they are stored.
  kernels_cfg = BASE.replace(attention_impl='pallas_triton', attention_platform='gpu', max_len=64)
  assert select.plan(kernels_cfg.replace(remat_dropout_masks='stored'), 64).remat_keeps_masks
  drawn = select.plan(kernels_cfg.replace(remat_dropout_masks='drawn'), 64)
  assert not drawn.remat_keeps_masks and not drawn.remat_mask_pass
  layer = select.plan(kernels_cfg.replace(remat_dropout_masks='per_layer'), 64)
  assert layer.remat_mask_pass and not layer.remat_keeps_masks
  with pytest.raises(ConfigError, match="model.remat_dropout_masks='kept': must be one of"):
    BASE.replace(remat_dropout_masks='kept')
