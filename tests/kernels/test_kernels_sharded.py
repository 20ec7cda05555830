"""The fused kernels inside the sharded train setup on 8 forced CPU devices (a subprocess,
tests/kernels_sharded_check.py): RealFormer on a data x fsdp x tensor = 2 x 2 x 2 mesh with
attention dropout 0.5, the Pallas kernels (interpret mode, per shard under jax.shard_map)
against the einsum path. Each shard's kernels draw the single-device dropout masks (global
element positions), so gradients agree to float32 rounding (measured 2e-7 of the largest);
masks drawn without the shards' batch offsets moved them by 7e-3 (while the loss moved by only
3e-6 relative: a loss comparison would not see it). Then one compiled train step with the
kernels gives the same loss."""

import pytest

from tests import scale_out_support as support


@pytest.mark.slow
def test_kernels_on_a_2x2x2_mesh_give_the_einsum_path_gradients():
  report = support.run_check('kernels_sharded_check', 8)
  assert report['devices'] == 8
  assert report['grad_difference'] <= 1e-5, report
  assert abs(report['loss_pallas'] - report['loss_xla']) <= 1e-5 * report['loss_xla'], report
  assert abs(report['step_loss'] - report['loss_pallas']) <= 1e-6 * report['loss_xla'], report
