"""The ring's fused qk block kernels state their cost to the estimator (realformer_jax/aot) as
the one-device qk kernels do: a square block is priced as the one-device call of that shape, and
a block of its own lengths states the matmul FLOPs of its shape; the slot-bucket switch of the
ring's block backward is costed per branch taken, as the one-device backward's. The kernels'
metadata is read off their pallas_calls as the real block_forward / block_backward make them
(traced by jax.eval_shape: nothing runs, no compiler or device); the roofline prices it on an
H200."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from realformer_jax.aot import hlo_text, roofline, switches, targets
from realformer_jax.kernels.backends.triton import qk_attention
from realformer_jax.kernels.backends.triton.tiles import device_sms
from realformer_jax.kernels.plumbing.spec import KernelSpec
from tests.aot.test_aot_kernel_costs import _stated, _triton_call

H200 = targets.parse('h200:1')
# BERT-Base's stack at the ring's per-device length of configs/long_context.py
N, B, H, K, L = 12, 1, 12, 64, 131072
SPEC = KernelSpec('triton', False, False, 230, H, 128, 64, 64, block_bwd_rows=128)
BF16, F32 = jnp.bfloat16, jnp.float32


def _shape(*dims, dtype=BF16):
  return jax.ShapeDtypeStruct(dims, dtype)


def _stated_costs(monkeypatch, call, *args) -> dict:
  """{pallas_call name: its metadata} of the kernels call(*args) makes, traced abstractly."""
  seen, real = {}, pl.pallas_call

  def spy(*args, **kwargs):
    seen[kwargs['name']] = kwargs.get('metadata')
    return real(*args, **kwargs)

  monkeypatch.setattr(pl, 'pallas_call', spy)
  jax.eval_shape(call, *args)
  return seen


def _common_args():
  return (
    _shape(B, 2, dtype=F32),  # fparams
    _shape(4, dtype=jnp.uint32),  # iparams
    _shape(1, dtype=jnp.int32),  # layer
  )


def _one_device(monkeypatch) -> dict:
  fparams, iparams, layer = _common_args()
  stack, v, bias = _shape(2, N, B, L, H, K), _shape(B, L, H, K), _shape(B, L, dtype=F32)
  stats = (_shape(B, H, L, dtype=F32),) * 2

  def call(stack, v, bias, stats, fparams, iparams, layer):
    qk_attention.forward(stack, v, bias, fparams, iparams, layer, SPEC)
    qk_attention.backward(
      stack, v, v, stats, stats[0], bias, fparams, iparams, layer, None, stack, SPEC
    )

  return _stated_costs(monkeypatch, call, stack, v, bias, stats, fparams, iparams, layer)


def _ring_block(monkeypatch, rows: int, cols: int) -> dict:
  fparams, iparams, layer = _common_args()
  q, k = _shape(N, B, rows, H, K), _shape(N, B, cols, H, K)
  v, bias, origin = _shape(B, cols, H, K), _shape(B, cols, dtype=F32), _shape(2, dtype=jnp.int32)
  do, stats = _shape(B, rows, H, K), (_shape(B, H, rows, dtype=F32),) * 2
  grads = (
    _shape(N, B, rows, H, K, dtype=F32),
    _shape(N, B, cols, H, K, dtype=F32),
    _shape(B, cols, H, K, dtype=F32),
    _shape(B, cols, dtype=F32),
    _shape(B, dtype=F32),
  )

  def call(q, k, v, bias, do, stats, grads, fparams, iparams, layer, origin):
    qk_attention.block_forward(q, k, v, bias, fparams, iparams, layer, origin, 8 * L, SPEC)
    qk_attention.block_backward(
      q, k, v, do, stats, stats[0], bias, fparams, iparams, layer, origin, 8 * L, grads, SPEC
    )

  args = (q, k, v, bias, do, stats, grads, fparams, iparams, layer, origin)
  return _stated_costs(monkeypatch, call, *args)


def _seconds(metadata: dict) -> float:
  assert metadata, 'the kernel states no cost'
  (kernel,) = roofline.estimate(_triton_call(_stated(**metadata)), H200).kernels
  return kernel.seconds


def test_a_square_ring_block_is_priced_as_the_one_device_call(monkeypatch):
  one = _one_device(monkeypatch)
  ring = _ring_block(monkeypatch, L, L)
  pairs = [
    ('realformer_qk_attention_fwd', 'realformer_qk_ring_block_fwd'),
    ('realformer_qk_attention_ds', 'realformer_qk_ring_block_ds'),
  ]
  for one_name, ring_name in pairs:
    mine, theirs = ring[ring_name], one[one_name]
    # The same matmuls, hash, exps and tile (aot/sass.py divides a kernel's SASS by its tile):
    # only the block dS kernel's float32 dV and bias column sums differ, a fraction of a per cent.
    for field in ('flops', 'int_ops', 'transcendentals', 'tile_elements'):
      assert mine[field] == theirs[field], (ring_name, field)
    assert _seconds(mine) == pytest.approx(_seconds(theirs), rel=0.1), ring_name
  # Priced as the kernels that they are: bound by their L2 reloads or their compute, not
  # costed by their bytes (the uncosted forward was 1 ms a call at this shape)
  assert _seconds(ring['realformer_qk_ring_block_fwd']) > 0.3


def test_a_block_of_its_own_lengths_states_its_shape(monkeypatch):
  rows, cols = L // 2, L
  ring = _ring_block(monkeypatch, rows, cols)
  mean_layers = (N + 1) / 2  # the mean l + 1 over the stack: slots <= l only
  elements = B * H * rows * cols
  forward = ring['realformer_qk_ring_block_fwd']
  assert int(forward['flops']) == int(2 * (mean_layers + 1) * elements * K)
  # The dS kernel runs in column panels of one (batch, head) at this size (column_panels); its
  # matmuls (acc, dO V^T, dV) per panel, times the panels and heads, are the block's.
  ds = ring['realformer_qk_ring_block_ds']
  columns = qk_attention.column_panels(B, H, cols, 2, SPEC.block_bwd, device_sms(), rows=rows)
  panel_elements = rows * columns
  assert int(ds['flops']) == int(2 * (mean_layers + 2) * panel_elements * K)
  assert int(ds['int_ops']) > 0 and int(ds['l2_bytes']) > int(ds['bytes_accessed'])


def _conditional(op_name: str) -> hlo_text.Instruction:
  """A 4-branch conditional returning the ring's [N, B, L, H, K] float32 stack gradients."""
  grads = 'f32[12,1,64,2,8]{4,3,2,1,0}'
  line = (
    f'%conditional.6 = ({grads}, {grads}) conditional(%index, %tuple.1, %tuple.1, %tuple.1, '
    '%tuple.1), branch_computations={%b0, %b1, %b2, %b3}, '
    f'metadata={{op_name="{op_name}"}}'
  )
  return hlo_text.parse_instruction(line)


def test_the_ring_backward_switch_takes_its_slot_buckets_by_layer_share():
  # BERT-Base's 12 layers: buckets of 3, 6, 9 and 12 slots, three layers each, every layer
  # attending the same number of blocks: not the 12-slot branch's matmuls every time.
  ring = _conditional('jit(train_step)/transpose(jvp(MaskedLM))/attention/ring_attention/cond')
  computation = hlo_text.Computation('c', [ring])
  assert switches.branch_shares(ring, computation) == (0.25, 0.25, 0.25, 0.25)
  # The same arrays outside the ring: a conditional the rule does not know
  other = _conditional('jit(train_step)/something/cond')
  assert switches.branch_shares(other, hlo_text.Computation('c', [other])) is None
