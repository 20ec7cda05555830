"""Kernels prove themselves on the device before a run trusts them.

The Pallas kernels are tested in interpret mode on CPU; on a GPU or TPU they are compiled by
Triton / Mosaic, which the CPU tests never reach. So before the first step of a run whose
attention takes a compiled kernel (`attention_impl='auto'` or 'pallas*' on a GPU / TPU), the
train setup (train/build.py) calls `fallback(config, attention_plan, devices)` with the plan it
resolved once (kernels/plumbing/select.py `for_run`): a tiny encoder with the run's own
attention settings (head size, dtype, layer-norm placement, residual attention, scales, RoPE,
dropout, remat, the recomputed stack) runs forward and backward once through the
kernels and once through the einsum path on that device, at the kernels' real tile sizes, with
padding and the same dropout masks. Its outputs and parameter gradients must agree within
TOLERANCE of their largest value (float32 matmuls at 'highest' on the einsum side). It runs an
encoder, so it lives above the model (kernels/ never imports the model).

On a mismatch, a compile error or a runtime failure, 'auto' falls back to the einsum path with
one `warning:` line saying why, and an explicit kernel stops with one ConfigError line. The
verdict is cached in memory and on disk (`attention_checks.json` under $REALFORMER_JAX_CACHE,
default ~/.cache/realformer_jax) per device kind, jax / jaxlib version, kernel source (a hash
of realformer_jax/kernels/, every backend's folder included, and model/) and problem, so a
run pays for the check once. `model.attention_check=False` skips it. A deviceless compile
(devices of a topology, not of this process) and CPU runs (interpret mode) are never checked
here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.analysis import check_cache
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.plumbing import select

# Largest |kernel - einsum| over the largest |einsum|, per output and gradient. The kernels'
# own float32 dots may run at TF32 on a GPU; a wrong tile, mask or scale is off by far more.
TOLERANCE = {'float32': 5e-3, 'float16': 2e-2, 'bfloat16': 5e-2}
_ROWS = 2  # sequences; the second is padded after three quarters of its length
_CACHE_FILE = 'attention_checks.json'
_verdicts: dict[str, 'Verdict'] = {}


@dataclasses.dataclass(frozen=True)
class Verdict:
  ok: bool
  why: str  # 'worst relative error 3.1e-07 (limit 5e-03)' or what failed
  worst: Optional[float] = None


def check_length(plan: select.AttentionPlan) -> int:
  """The probe's sequence length: several of the real tiles per row and column on a device;
  in interpret mode (tests) a toy length that still takes several of its 16-wide tiles."""
  return 32 if plan.interpret else 256


def probe_config(config: ModelConfig, plan: select.AttentionPlan, length: int) -> ModelConfig:
  """The run's attention settings on a two-layer, two-head encoder of the run's head size,
  with the kernel family named explicitly (so that the probe takes it even where 'auto'
  would not)."""
  head_dim = config.head_dim
  return config.replace(
    vocab_size=64,
    hidden_size=2 * head_dim,
    num_heads=2,
    mlp_dim=2 * head_dim,
    num_layers=2,
    scan_unroll=1,
    max_len=length,
    attention_impl=plan.kernels.attention_impl,
  )


def cache_key(device: Any, probe: ModelConfig, length: int) -> str:
  import jaxlib  # pylint: disable=import-outside-toplevel

  parts = [
    device.platform,
    getattr(device, 'device_kind', '?'),
    jax.__version__,
    jaxlib.__version__,
    check_cache.kernel_source_hash(probe.attention_impl),
    repr(probe),
    str(length),
  ]
  return hashlib.sha256('\n'.join(parts).encode()).hexdigest()[:24]


def _save_disk(key: str, verdict: Verdict, device: Any) -> None:
  entries = check_cache.load(_CACHE_FILE)
  entries[key] = dict(dataclasses.asdict(verdict), device_kind=getattr(device, 'device_kind', '?'))
  check_cache.save(_CACHE_FILE, entries)


def _problem(probe: ModelConfig, length: int):
  """(params, ids, mask, dropout key, output weights) of the probe, from fixed seeds."""
  from realformer_jax.model.encoder import Encoder  # pylint: disable=import-outside-toplevel

  ids = jax.random.randint(jax.random.key(1), (_ROWS, length), 1, probe.vocab_size)
  mask = jnp.ones((_ROWS, length), jnp.int32).at[1, (3 * length) // 4 :].set(0)
  params = Encoder(probe.replace(attention_impl='xla')).init(jax.random.key(0), ids, mask)
  weights = jnp.linspace(-1.0, 1.0, probe.hidden_size, dtype=jnp.float32)
  return params, ids, mask, jax.random.key(5), weights


def run_probe(probe: ModelConfig, problem) -> tuple[jax.Array, Any]:
  """(encoder output, parameter gradients) of the probe, dropout on: the one place a check
  runs attention (tests replace it to fake a broken kernel)."""
  from realformer_jax.model.encoder import Encoder  # pylint: disable=import-outside-toplevel

  params, ids, mask, key, weights = problem

  def loss(p):
    h = Encoder(probe).apply(p, ids, mask, deterministic=False, rngs={'dropout': key})
    h = h.astype(jnp.float32)
    return jnp.sum(jnp.sin(h) * weights), h

  (_, hidden), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return jax.block_until_ready((hidden, grads))


def relative_error(actual, expected) -> float:
  """Largest |actual - expected| over the largest |expected| (inf if not finite)."""
  a, e = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
  if not np.all(np.isfinite(a)):
    return float('inf')
  return float(np.max(np.abs(a - e)) / max(float(np.max(np.abs(e))), 1e-30))


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f'{type(e).__name__}: {text[0][:200] if text else ""}'.rstrip(': ')


def compare(probe: ModelConfig, length: int) -> Verdict:
  """The probe through its kernels against the einsum path, on the default device."""
  with jax.default_matmul_precision('highest'):
    problem = _problem(probe, length)
    want = run_probe(probe.replace(attention_impl='xla'), problem)
    try:
      got = run_probe(probe, problem)
    except Exception as e:  # pylint: disable=broad-except
      return Verdict(False, f'the kernels failed to compile or run ({_first_line(e)})')
  errors = jax.tree.leaves(jax.tree.map(relative_error, got, want))
  worst = max(errors)
  limit = TOLERANCE[probe.dtype]
  text = f'worst relative error {worst:.1e} in outputs and gradients (limit {limit:.0e})'
  return Verdict(bool(worst <= limit), text, worst if np.isfinite(worst) else None)


def _kernel_to_check(
  attention_plan: Optional[select.AttentionPlan], devices: Sequence[Any]
) -> Optional[select.AttentionPlan]:
  """The compiled kernel this run takes on devices of this process, or None (einsum path,
  cuDNN, interpret mode on CPU, or a deviceless compile for a target)."""
  if attention_plan is None or attention_plan.path != 'pallas' or attention_plan.interpret:
    return None
  if not devices or devices[0] not in jax.devices():
    return None
  return attention_plan


def verdict_for(config: ModelConfig, attention_plan: select.AttentionPlan, device: Any) -> Verdict:
  """The cached verdict for this device kind, versions, kernel source and problem, or a new
  check on `device` (all processes of a multi-process run agree: one failure fails all)."""
  length = check_length(attention_plan)
  probe = probe_config(config, attention_plan, length)
  key = cache_key(device, probe, length)
  if key not in _verdicts:
    cached = check_cache.load(_CACHE_FILE).get(key)
    if cached is not None:
      verdict = Verdict(cached['ok'], cached['why'], cached.get('worst'))
    else:
      with jax.default_device(device):
        verdict = compare(probe, length)
      _save_disk(key, verdict, device)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

      oks = multihost_utils.process_allgather(np.int32(verdict.ok))
      if verdict.ok and not np.all(oks):
        verdict = Verdict(False, 'the check failed on another process of this run')
    _verdicts[key] = verdict
  return _verdicts[key]


def fallback(
  config: ModelConfig, attention_plan: Optional[select.AttentionPlan], devices: Sequence[Any]
) -> dict[str, str]:
  """What the check changes in `config` (the run's, as the train setup decided it with
  `attention_plan`: kernels/plumbing/select.py `for_run`), for the caller to apply: nothing
  where the kernel passes on these devices (or no check is asked), attention_impl='xla' where
  'auto''s kernel failed. An explicit kernel that fails raises ConfigError."""
  if not config.attention_check:
    return {}
  attention_plan = _kernel_to_check(attention_plan, devices)
  if attention_plan is None:
    return {}
  verdict = verdict_for(config, attention_plan, devices[0])
  if verdict.ok:
    return {}
  kind = getattr(devices[0], 'device_kind', devices[0].platform)
  what = f'the {attention_plan.backend} attention kernels failed their check on {kind}'
  if config.attention_impl == 'auto':
    if jax.process_index() == 0:
      print(
        f"warning: {what}: {verdict.why}; using the einsum path (attention_impl='xla'). "
        'Please report it (python -m experiments.device_check); model.attention_check=False '
        'uses the kernels anyway',
        file=sys.stderr,
        flush=True,
      )
    return {'attention_impl': 'xla'}
  raise ConfigError(
    f'model.attention_impl={config.attention_impl!r}: {what}: {verdict.why}; use '
    "attention_impl='xla' or 'auto' (model.attention_check=False runs them unchecked)"
  )
