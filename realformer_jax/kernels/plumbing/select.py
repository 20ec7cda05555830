"""Which attention path a model takes, and which carry residual attention takes.

## Kernels: `ModelConfig.attention_impl` on a platform

| attention_impl | cpu                     | gpu                        | tpu                      |
|----------------|-------------------------|----------------------------|--------------------------|
| auto           | xla (einsum path)       | pallas_triton              | pallas_mosaic            |
| xla            | einsum path             | einsum path                | einsum path              |
| pallas         | pallas_triton, interpret| pallas_triton              | pallas_mosaic            |
| pallas_triton  | interpret mode          | Triton kernels             | error                    |
| pallas_mosaic  | interpret mode          | error                      | Mosaic kernels           |
| cudnn          | error                   | jax's cuDNN flash attention| error                    |

The table is what the registered backends' records say (kernels/backends/: each backend's
platform, whether 'auto' / 'pallas' take it there, whether it runs in interpret mode on a
CPU); a backend registered later adds a row. `check` refuses, in one line, an attention_impl
that names no backend and a backend asked for what its record says it cannot do.

The platform is `ModelConfig.attention_platform`; the train setup sets it to the platform of
the mesh's devices (`for_run`; `resolve_platform` alone), which in a deviceless compile is the
target's, not `jax.default_backend()`. Left at 'auto' (a model used directly), it is the
default backend when traced. 'auto' also takes the einsum path for a sequence length the
kernels cannot tile (and when attention maps are asked for: `sow`n maps need the
probabilities the kernels never write); an explicit kernel raises a one-line ConfigError
instead.

## Carry: `model.residual_carry='auto'`

Which carry residual attention takes, decided once when the train setup builds the model
(`for_run`; `resolved` alone) and logged with the reason; a model used directly decides it when
traced (`resolve_residual_carry`, kernels/score_paths/score_path.py).

The rule looks at time first, then memory. Per score element of layer l the carries cost, in
attention matmul FLOPs (K = head dim; one forward and the backward; a rematerialised layer adds
its forward again to each):
  'scores', residual_scores_backward='saved'       14 K   (the carried float32 sum, saved)
  'scores', residual_scores_backward='recomputed'  18 K   (+ one forward going down)
  'qk'                                             (14 + 8 l) K   (the sum rebuilt per tile
                                                   from every layer's q, k: ~4x over 12 layers)
and on an H200 the qk Triton kernels of before issue 40 measured 9.6x Post-LN's step at
L = 65,536 (docs/performance.md). So:

1. 'scores' with 'saved' while the sums it holds for ONE sequence fit SCORES_SHARE of the
   device's budget (num_layers + 2 sums: one per layer for the backward, the carry in flight
   and its gradient; measured in a deviceless H100 compile of BERT-Base at 16k and 32k);
2. else 'scores' with 'recomputed' (2 sums) while those fit (it needs scan_layers);
3. else 'qk' (kernels/score_paths/qk_carry.py: the stacked queries and keys, memory linear in L),
but only
   where a fused kernel serves the platform and length (`plan` above): on the einsum
   path (attention_impl='xla', a CPU, or a length the kernels cannot tile) 'qk' materialises the
   same [B, H, L, L] scores per layer, so it saves no memory and multiplies FLOPs;
4. else (no fused kernel) the smallest sum, logged as not fitting: train/build.py (resolve) then
   reports the shortfall.

One sequence, not the batch: 'auto' accumulation (train/build.py: resolve) splits the batch into
microbatches that fit. The budget: what the train setup gives (`train.device_memory_bytes`, or
in a deviceless compile the target's: build.memory_budget), else the first local device's
`bytes_limit`; a device that reports none (a CPU) keeps the configured sum.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple, Optional, Sequence

import jax

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels import backends
from realformer_jax.kernels.backends.registry import MODES
from realformer_jax.kernels.dropout import remat_masks
from realformer_jax.kernels.dropout.remat_masks import MaskChoice, masks_matter

_log = logging.getLogger(__name__)

_PLATFORM_NAMES = {'cpu': 'cpu', 'gpu': 'gpu', 'cuda': 'gpu', 'rocm': 'gpu', 'tpu': 'tpu'}


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
  """A fused path: a registered backend, and the tile sizes of its kernels."""

  path: str  # 'pallas': a fused backend's kernels (fused.py); 'call': a call backend
  backend: Optional[str] = None  # its name: 'triton' | 'mosaic' | 'cudnn' | ...
  interpret: bool = False
  block_q: int = 0
  block_k: int = 0
  block_bwd: int = 0
  # Each layer is rematerialised (model.remat_policy != 'none'): plain attention keeps its
  # output and row statistics for the backward instead of running again (KernelSpec.for_remat).
  rematerialised: bool = False
  # ... and keeps each layer's dropout mask for the backward (model.remat_dropout_masks
  # 'stored', or 'auto' decided so: choose_masks), or draws it by a pass before each layer's
  # backward ('per_layer'); else the backward draws it in its loops.
  remat_keeps_masks: bool = False
  remat_mask_pass: bool = False
  dropout_generator: str = 'threefry'  # model.dropout_generator: the kernels draw its masks

  @property
  def kernels(self) -> backends.Backend:
    """The backend's record."""
    return backends.get(self.backend)


def platform_of(devices: Sequence[jax.Device]) -> str:
  """'cpu' | 'gpu' | 'tpu' for a list of devices (a mesh's, or a deviceless target's)."""
  platform = devices[0].platform.lower()
  if platform not in _PLATFORM_NAMES:
    raise ConfigError(f'model.attention_platform: unknown device platform {platform!r}')
  return _PLATFORM_NAMES[platform]


def resolve_platform(config: ModelConfig, devices: Sequence[jax.Device]) -> ModelConfig:
  """`config` with attention_platform set to the devices' platform (unless set by hand)."""
  change = _platform_change(config, devices)
  return config.replace(**change) if change else config


def _platform_change(config: ModelConfig, devices: Sequence[jax.Device]) -> dict:
  if config.attention_platform != 'auto':
    return {}
  return {'attention_platform': platform_of(devices)}


def _platform(config: ModelConfig) -> str:
  if config.attention_platform != 'auto':
    return config.attention_platform
  return _PLATFORM_NAMES.get(jax.default_backend(), 'cpu')


def block_sizes(backend: str, seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """(block_q, block_k, block_bwd) of a backend's kernels for a sequence length, or None if it
  cannot be tiled (the backend's tile rule: kernels/backends/<name>/__init__.py)."""
  return backends.get(backend).tiles(seq_len, interpret)


def check(config: ModelConfig, carry: Optional[str] = None) -> None:
  """Refuses in one line an attention_impl that names no registered backend, and a named
  backend asked for what it cannot do (residual scores, attention dropout, qk kernels) with
  `carry` (default config.residual_carry). The train setup calls it before any data is built;
  `plan` again when the model is traced."""
  impl = config.attention_impl
  if impl in MODES:
    return
  backend = backends.for_impl(impl)
  if backend is None:
    raise ConfigError(
      f'model.attention_impl={impl!r}: must be one of {", ".join(backends.attention_impls())}'
    )
  _check_support(config, backend, config.residual_carry if carry is None else carry)


def _check_support(config: ModelConfig, backend: backends.Backend, residual_carry: str) -> None:
  impl = config.attention_impl
  if (
    config.use_residual_attention
    and not backend.residual
    and not (residual_carry == 'qk' and backend.qk)
  ):
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend.name} backend cannot carry residual '
      "scores; use 'pallas' (or 'auto') for residual attention"
      + (", or model.residual_carry='qk'" if backend.qk else '')
    )
  if backend.dtypes and config.dtype not in backend.dtypes:
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend.name} kernels take '
      f'{" or ".join(backend.dtypes)} (model.dtype={config.dtype!r}); use '
      "'pallas' (or 'auto')"
    )
  if config.attention_dropout_rate > 0 and not backend.dropout:
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend.name} backend has no attention dropout '
      f'(model.attention_dropout_rate={config.attention_dropout_rate}); set it to 0 or use '
      "'pallas'"
    )
  if (
    config.attention_dropout_rate > 0
    and backend.dropout
    and config.dropout_generator not in backend.dropout_generators
  ):
    raise ConfigError(
      f'model.dropout_generator={config.dropout_generator!r}: the {backend.name} backend '
      f'(model.attention_impl={impl!r}) draws only {", ".join(backend.dropout_generators)} '
      "masks; use one of those, or attention_impl='xla'"
    )
  if config.use_residual_attention and residual_carry == 'qk' and not backend.qk:
    raise ConfigError(
      f"model.residual_carry='qk': the {backend.name} backend (model.attention_impl="
      f"{impl!r}) has no qk kernels; use residual_carry='scores' or attention_impl='pallas'"
    )


def check_qk(config: ModelConfig, attention_plan: Optional[AttentionPlan]) -> None:
  """Refuses a plan whose backend has no qk kernels for a stack that carries queries and keys
  (residual_carry 'qk', or 'auto' decided so for this length)."""
  if attention_plan is not None:
    _check_support(config, attention_plan.kernels, 'qk')


def _platform_backend(impl: str, platform: str) -> Optional[backends.Backend]:
  """The backend 'auto' / 'pallas' take on a platform: its default one; 'pallas' on a CPU
  takes the first that runs in interpret mode."""
  for backend in backends.registered():
    if backend.platform == platform and backend.platform_default:
      return backend
  if impl == 'pallas' and platform == 'cpu':
    for backend in backends.registered():
      if backend.interpret:
        return backend
  return None


class _Decided(NamedTuple):
  """The fields of a config that a run decides, as planning reads them: a run's decisions
  before they are applied (`for_run`), or the config's own (`of`)."""

  platform: str  # 'cpu' | 'gpu' | 'tpu'
  carry: str  # residual_carry
  masks: Optional[str] = None  # remat_dropout_masks decided; None: choose_masks decides

  @classmethod
  def of(cls, config: ModelConfig) -> '_Decided':
    return cls(_platform(config), config.residual_carry)


def plan(
  config: ModelConfig, seq_len: int, *, maps_requested: bool = False
) -> Optional[AttentionPlan]:
  """The fused path for this config and sequence length, or None for the einsum path."""
  return _plan(config, seq_len, _Decided.of(config), maps_requested)


def _plan(
  config: ModelConfig, seq_len: int, decided: _Decided, maps_requested: bool = False
) -> Optional[AttentionPlan]:
  check(config, decided.carry)
  impl = config.attention_impl
  if impl == 'xla' or maps_requested:
    return None
  platform = decided.platform
  backend = backends.for_impl(impl) or _platform_backend(impl, platform)
  if backend is None:
    if impl == 'auto':
      return None
    raise ConfigError(f"model.attention_impl='pallas': no kernel backend runs on {platform}")
  if impl in MODES:
    try:
      _check_support(config, backend, decided.carry)
    except ConfigError:
      if impl == 'auto':  # the platform's kernels cannot do this: the einsum path can
        return None
      raise
  interpret = platform != backend.platform
  if interpret and not (platform == 'cpu' and backend.interpret):
    raise ConfigError(
      f'model.attention_impl={impl!r}: needs a {backend.platform.upper()} (the '
      f"{backend.name} kernels do not run on {platform}); use 'pallas' (or 'auto')"
    )
  attention_plan = _tiled(config, backend, seq_len, interpret, decided.masks)
  if attention_plan is None and impl != 'auto':
    raise ConfigError(
      f'model.attention_impl={impl!r}: sequence length {seq_len} cannot be tiled by the '
      f'{backend.name} kernels (needs {backend.tile_rule})'
    )
  return attention_plan


def _tiled(
  config: ModelConfig,
  backend: backends.Backend,
  seq_len: int,
  interpret: bool,
  masks: Optional[str] = None,
) -> Optional[AttentionPlan]:
  """`backend`'s plan for this config at this length (a call backend's needs no tiles), or
  None where its kernels cannot tile the length. `masks`: remat_dropout_masks as a run decided
  it (default: choose_masks')."""
  if not backend.fused:
    return AttentionPlan('call', backend.name)
  blocks = backend.tiles(seq_len, interpret)
  if blocks is None:
    return None
  rematerialised = config.remat_policy != 'none'
  if rematerialised and masks is None:
    masks = choose_masks(config, seq_len).masks
  masks = masks if rematerialised else None
  return AttentionPlan(
    'pallas',
    backend.name,
    interpret,
    *blocks,
    rematerialised=rematerialised,
    remat_keeps_masks=masks == 'stored',
    remat_mask_pass=masks == 'per_layer',
    dropout_generator=config.dropout_generator,
  )


def pair_carry(config: ModelConfig, attention_plan: Optional[AttentionPlan]) -> bool:
  """Whether a layer stack carries residual scores as a `carried.CarriedScores` pair and seals
  it (the kernels then rebuild each layer's sum going down instead of saving it). Not under a
  per-layer remat: that saves every layer's carried input anyway, and the pair would double
  it; `residual_scores_backward='recomputed'` is the memory-flat route there."""
  return (
    attention_plan is not None
    and attention_plan.path == 'pallas'
    and config.use_residual_attention
    and config.remat_policy == 'none'
  )


# The carry: residual_carry='auto' (the module docstring's second part).

# Share of the budget the carried sums may take: the rest holds the weights, the optimizer
# state and the other activations (BERT-Base at L = 65,536 needs 10.7 GiB for those alone).
SCORES_SHARE = 0.75
SUM_BYTES_PER_ELEMENT = 4  # the sum is float32 whatever the compute dtype
# Attention matmul FLOPs per score element and head dim, forward + backward (module docstring).
FLOPS_PER_ELEMENT = {'saved': 14, 'recomputed': 18}
QK_EXTRA_PER_LAYER = 8  # 'qk' at layer l: 14 + 8 l


class CarryChoice(NamedTuple):
  carry: str  # 'scores' | 'qk'
  scores_backward: str  # residual_scores_backward the model takes ('saved' | 'recomputed')
  reason: str  # for the log line


def device_memory_bytes() -> Optional[int]:
  """The first local device's memory limit, or None where it reports none."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else stats.get('bytes_limit')


def sums_held(config: ModelConfig, backward: Optional[str] = None) -> int:
  """How many [H, L, L] sums the scores carry holds per sequence (module docstring), with
  residual_scores_backward `backward` (default: the config's)."""
  backward = config.residual_scores_backward if backward is None else backward
  return 2 if backward == 'recomputed' else config.num_layers + 2


def scores_carry_bytes(config: ModelConfig, seq_len: int, backward: Optional[str] = None) -> int:
  """Bytes of the carried sums for one sequence under residual_carry='scores' (and `backward`,
  default the config's residual_scores_backward)."""
  held = sums_held(config, backward)
  return held * SUM_BYTES_PER_ELEMENT * config.num_heads * seq_len * seq_len


def attention_flops_factor(config: ModelConfig, carry: str) -> float:
  """A carry's attention matmul FLOPs over the saved sum's (module docstring)."""
  layers = config.num_layers
  if carry == 'qk':
    qk = sum(FLOPS_PER_ELEMENT['saved'] + QK_EXTRA_PER_LAYER * l for l in range(layers))
    return qk / (FLOPS_PER_ELEMENT['saved'] * layers)
  return FLOPS_PER_ELEMENT[carry] / FLOPS_PER_ELEMENT['saved']


def fused_kernel(
  config: ModelConfig, seq_len: int, platform: Optional[str] = None
) -> Optional[str]:
  """The Pallas backend that would run this config at this length ('triton' | 'mosaic') on
  `platform` (default: the config's), or None on the einsum path."""
  decided = _Decided.of(config) if platform is None else _Decided(platform, config.residual_carry)
  attention_plan = _plan(config, seq_len, decided)
  if attention_plan is None or attention_plan.path != 'pallas':
    return None
  return attention_plan.backend


def _gib(n: float) -> str:
  return f'{n / 2**30:.3g} GiB'


def choose(
  config: ModelConfig,
  seq_len: int,
  memory_bytes: Optional[int] = None,
  sequence_shards: int = 1,
  platform: Optional[str] = None,
) -> CarryChoice:
  """The carry for config.residual_carry='auto' (module docstring); an explicit carry is kept.
  `sequence_shards`: devices the length is split over (ring attention): each holds 1/n of the
  sum's rows, and the ring rebuilds 'qk' sums per block, whatever the kernels. `platform`: the
  kernels' (default: the config's)."""
  configured = config.residual_scores_backward
  if config.residual_carry != 'auto':
    return CarryChoice(config.residual_carry, configured, 'set in the config')
  if memory_bytes is None:
    memory_bytes = device_memory_bytes()
  if memory_bytes is None:
    return CarryChoice('scores', configured, 'the device reports no memory limit')
  budget = SCORES_SHARE * memory_bytes
  shape = f'[{config.num_heads}, {seq_len}, {seq_len}] float32'
  candidates = [configured]
  if configured == 'saved' and config.scan_layers:
    candidates.append('recomputed')
  for backward in candidates:
    needed = scores_carry_bytes(config, seq_len, backward) // sequence_shards
    if needed <= budget:
      held = sums_held(config, backward)
      return CarryChoice(
        'scores',
        backward,
        f'the sum is the fastest carry that fits ({backward}: {held} x {shape} = '
        f'{_gib(needed)} <= {SCORES_SHARE:.0%} of {_gib(memory_bytes)}; attention FLOPs '
        f"x{attention_flops_factor(config, backward):.2f} of 'saved', 'qk' would be "
        f'x{attention_flops_factor(config, "qk"):.1f})',
      )
  smallest = candidates[-1]
  needed = scores_carry_bytes(config, seq_len, smallest) // sequence_shards
  backend = fused_kernel(config, seq_len, platform)
  backend = f'{backend} kernels' if backend else None
  if sequence_shards > 1:
    backend = f'ring attention blocks ({sequence_shards} devices)'
  if backend is not None:
    return CarryChoice(
      'qk',
      configured,
      f'even the {smallest} sum ({_gib(needed)}) outgrows {SCORES_SHARE:.0%} of '
      f'{_gib(memory_bytes)}; the {backend} rebuild it per tile from the stacked '
      f'queries and keys (memory linear in L, attention FLOPs '
      f'x{attention_flops_factor(config, "qk"):.1f})',
    )
  return CarryChoice(
    'scores',
    smallest,
    f'the {smallest} sum ({_gib(needed)}) does not fit {SCORES_SHARE:.0%} of '
    f'{_gib(memory_bytes)}, but no fused kernel serves this platform and length '
    f"(attention_impl={config.attention_impl!r}, L = {seq_len}): 'qk' on the einsum path "
    'materialises the same scores, saving no memory for '
    f'x{attention_flops_factor(config, "qk"):.1f} the attention FLOPs',
  )


# Rematerialised plain attention's dropout masks: model.remat_dropout_masks='auto'
# (kernels/dropout/remat_masks.py: stored or drawn, the cheaper that fits).


def choose_masks(
  config: ModelConfig, seq_len: int, memory_bytes: Optional[int] = None
) -> MaskChoice:
  """remat_masks.choose_masks against `memory_bytes`, else the first local device's."""
  if memory_bytes is None and config.remat_dropout_masks == 'auto':
    memory_bytes = device_memory_bytes()
  return remat_masks.choose_masks(config, seq_len, memory_bytes)


def _logged(
  config: ModelConfig,
  seq_len: int,
  memory_bytes: Optional[int],
  sequence_shards: int = 1,
  platform: Optional[str] = None,
) -> CarryChoice:
  choice = choose(config, seq_len, memory_bytes, sequence_shards, platform)
  if config.residual_carry == 'auto':
    _log.info(
      "model.residual_carry='auto' -> %r (residual_scores_backward=%r): %s",
      choice.carry,
      choice.scores_backward,
      choice.reason,
    )
  return choice


def resolve_residual_carry(
  config: ModelConfig, seq_len: int, memory_bytes: Optional[int] = None
) -> str:
  """'scores' or 'qk' for config.residual_carry (choose()), logged when it was 'auto'."""
  return _logged(config, seq_len, memory_bytes).carry


class PassedBackend(NamedTuple):
  """A backend that needs a passed device check and has one on the run's device kind
  (analysis/device_checks.py: `passed_backends`, asked by the train setup)."""

  backend: backends.Backend
  device_kind: str
  faster: Optional[str]  # why 'auto' may take it: measured faster there; None: not (yet)
  record: str  # the file the pass is recorded in, for the log


class RunAttention(NamedTuple):
  """How a run's attention runs, decided once by the train setup (`for_run`)."""

  # The model fields decided (attention_platform, remat_dropout_masks, residual_carry and
  # residual_scores_backward, a checked backend's attention_impl; those left alone are not
  # named): the caller applies them to its config, once.
  changes: dict[str, str]
  # The fused path at the run's length that the kernel self-check proves
  # (analysis/kernel_check.py); None where none is asked (attention_check=False, the ring).
  plan: Optional[AttentionPlan]


def for_run(
  config: ModelConfig,
  devices: Sequence[jax.Device],
  seq_len: Optional[int],
  memory_bytes: Optional[int] = None,
  sequence_shards: int = 1,
  passed: Sequence[PassedBackend] = (),
) -> RunAttention:
  """How attention runs, decided once for a run on `devices`: attention_platform the devices'
  (resolve_platform), then residual_carry 'auto' the carry for `seq_len` against one device's
  `memory_bytes` (logged), the length split over `sequence_shards` devices; then the plan the
  self-check proves (none on a ring or with attention_check=False): a backend of `passed` that
  measured faster there (`_passed_plan`), else the platform's. Each decision reads the ones
  before it as decided, not yet applied; the model then reads concrete choices."""
  # The platform and the masks do not depend on each other; the carry reads the platform.
  changes = {**_platform_change(config, devices), **_masks_change(config, seq_len, memory_bytes)}
  platform = changes.get('attention_platform') or _platform(config)
  changes.update(_carry_change(config, seq_len, memory_bytes, sequence_shards, platform))
  if sequence_shards > 1 or not config.attention_check:  # the ring runs no kernel
    return RunAttention(changes, None)
  carry = changes.get('residual_carry', config.residual_carry)
  decided = _Decided(platform, carry, changes.get('remat_dropout_masks'))
  length = seq_len or 256
  taken = _passed_plan(config, length, passed, decided)
  if taken is None:
    return RunAttention(changes, _plan(config, length, decided))
  # The model then takes that backend by name.
  return RunAttention({**changes, 'attention_impl': taken.kernels.attention_impl}, taken)


def _passed_plan(
  config: ModelConfig, seq_len: int, passed: Sequence[PassedBackend], decided: _Decided
) -> Optional[AttentionPlan]:
  """For 'auto' / 'pallas': the plan of the first backend of `passed` (a passed device check
  on these devices) that measured faster than the default kernels there and runs this config
  at this length, logged; else None."""
  if config.attention_impl not in ('auto', 'pallas'):
    return None
  platform = decided.platform
  for backend, kind, why, record in passed:
    try:
      _check_support(config, backend, decided.carry)
    except ConfigError:
      continue  # this config (dtype, carry, dropout) is not one its kernels take
    interpret = platform != backend.platform
    if interpret and not (platform == 'cpu' and backend.interpret):
      continue
    attention_plan = _tiled(config, backend, seq_len, interpret, decided.masks)
    if attention_plan is None:
      continue  # nor this length
    if why is None:
      _log.info(
        'model.attention_impl=%r keeps the default kernels: %s passed its device check on %s '
        'but the device suite has not timed it faster there (%s)',
        config.attention_impl,
        backend.name,
        kind,
        record,
      )
      continue
    _log.info(
      'model.attention_impl=%r -> %r: experiments.device_check passed every %s case on %s '
      'with this jax and kernel source, and it measured faster (%s; %s)',
      config.attention_impl,
      backend.attention_impl,
      backend.name,
      kind,
      why,
      record,
    )
    return attention_plan
  return None


def resolved(
  config: ModelConfig, seq_len: Optional[int], memory_bytes: Optional[int], sequence_shards: int = 1
) -> ModelConfig:
  """`config` with residual_carry 'auto' replaced by the choice, and residual_scores_backward
  by the sum's backward it chose (unchanged without residual attention or a known length);
  remat_dropout_masks 'auto' by choose_masks' (where it matters), each logged."""
  changes = _masks_change(config, seq_len, memory_bytes)
  changes.update(_carry_change(config, seq_len, memory_bytes, sequence_shards, _platform(config)))
  return config.replace(**changes) if changes else config


def _masks_change(config: ModelConfig, seq_len: Optional[int], memory_bytes: Optional[int]) -> dict:
  """remat_dropout_masks 'auto' -> choose_masks' choice, logged, where it matters; else {}."""
  if not (seq_len and config.remat_dropout_masks == 'auto' and masks_matter(config)):
    return {}
  budget = device_memory_bytes() if memory_bytes is None else memory_bytes
  choice = remat_masks.choose_masks(config, seq_len, budget)
  _log.info("model.remat_dropout_masks='auto' -> %r: %s", choice.masks, choice.reason)
  return {'remat_dropout_masks': choice.masks}


def _carry_change(
  config: ModelConfig,
  seq_len: Optional[int],
  memory_bytes: Optional[int],
  sequence_shards: int,
  platform: str,
) -> dict:
  """residual_carry 'auto' -> the carry choose() takes on `platform`, and the sum's backward it
  chose (logged); {} without residual attention or a known length, or for an explicit carry."""
  if config.residual_carry != 'auto' or not config.use_residual_attention or not seq_len:
    return {}
  choice = _logged(config, seq_len, memory_bytes, sequence_shards, platform)
  return {'residual_carry': choice.carry, 'residual_scores_backward': choice.scores_backward}
