"""Accelerator targets for compiling on any machine: H100 / H200 / A100 GPUs and TPU v4 / v5e /
v5p / v6e slices, with the hardware numbers the memory check and the roofline use.

    target = targets.parse('h100:8')        # 8 H100 SXM 80 GB (one host)
    target = targets.parse('a100-40g:16')   # 16 A100 40 GB (two hosts of 8)
    target = targets.parse('v5e:2x4')       # a TPU v5e slice, jax's topology name
    devices = target.devices()              # compile-only devices: build a Mesh from them

`devices()` needs the accelerator's compiler installed (jax-cuda13-plugin for GPUs, libtpu for
TPUs: `pip install -e '.[aot]'`) and JAX started with `JAX_PLATFORMS=cpu`, so that nothing tries
to open a device. No device, driver or network is used: XLA compiles for the description.

Hardware numbers are the chips' public specifications (NVIDIA H100, H200 and A100 datasheets,
Google Cloud TPU system-architecture pages), dense (no sparsity) peaks per device. Two figures per
chip are *roofline* rates, what a kernel can reach rather than the datasheet's: for the H100, the
bfloat16 matmul rate measured through jax on an H100 (805 TFLOP/s, an 8192^3 matmul, issue 11)
and 3.0 TB/s of HBM bandwidth (90 % of 3.35); the other chips are assumed to reach the same
fractions of their datasheet numbers (an assumption, not a measurement). MFU is always quoted
against the datasheet peak.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Mapping, Optional

from realformer_jax.config import ConfigError
from realformer_jax.units import GiB

GB = 10**9
TERA = 10**12
# Measured on an H100 through jax (issue 11): bf16 8192^3 matmul 805 TFLOP/s of 989.4.
_MATMUL_FRACTION = 805 / 989.4
_HBM_FRACTION = 0.9  # 3.0 of 3.35 TB/s: the issue's calibration constant


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator device type (a GPU, or a TPU chip in megacore mode where it has two
  TensorCores)."""

  name: str  # the key in CHIPS ('h100', 'a100-40g', 'v5e', ...)
  platform: str  # 'cuda' | 'tpu'
  description: str
  memory_bytes: int  # HBM per device
  hbm_bytes_per_s: float  # datasheet bandwidth
  # Dense matmul peaks (datasheet), FLOP/s per device, by the operands' arithmetic:
  # 'bf16' (also f16), 'tf32' (a GPU's default for float32 dots), 'f32' (full float32:
  # CUDA cores on a GPU, 6 bf16 passes on a TPU), 'fp8', 'int8'.
  matmul_flops: Mapping[str, float]
  interconnect_bytes_per_s: float  # per device, one direction (NVLink / ICI)
  launch_overhead_s: float  # per kernel (GPU launch); 0 on TPU, whose ops run back to back
  # Element-wise throughput (ops/s per device) for the vector ceiling of non-matmul kernels:
  # float ops, integer ops, transcendentals (exp, log, erf, ...). None: not modelled (TPU).
  vector_flops: Optional[float] = None
  vector_int_ops: Optional[float] = None
  transcendentals: Optional[float] = None
  # What a kernel that re-reads tiles or adds atomically meets (GPUs; None: not modelled):
  # bytes/s between the SMs and L2 (a kernel's stated `l2_bytes`), and global atomic element
  # updates/s at acq_rel gpu scope (its stated `atomics`). Sources: HOPPER_L2_SOURCE,
  # HOPPER_ATOMIC_SOURCE.
  l2_bytes_per_s: Optional[float] = None
  atomic_updates_per_s: Optional[float] = None
  # A fused custom kernel (a Pallas Triton kernel that states its cost: flash attention) runs
  # its matmuls and its CUDA-core work in sequence (roofline.kernel_seconds), at this share of
  # the peak rates above. Source: FUSED_KERNEL_EFFICIENCY_SOURCE (fitted, GPUs only).
  fused_kernel_efficiency: float = 1.0
  # Streaming multiprocessors (GPUs): a fused kernel whose grid has fewer programs leaves the
  # rest idle (roofline.kernel_seconds). None: not modelled.
  sms: Optional[int] = None
  # Thread instructions/s the warp schedulers issue (GPUs: 4 schedulers an SM, one warp
  # instruction of 32 threads each a clock), and the share of it a fused kernel's element loops
  # reach: what a kernel's SASS issues (aot/sass.py, work['issued']) is charged at their
  # product. Source: ISSUE_EFFICIENCY_SOURCE (fitted). None: not modelled.
  issue_per_s: Optional[float] = None
  issue_efficiency: float = 1.0
  # Share of memory_bytes an XLA program can use by default: JAX preallocates 75 % of a GPU
  # (XLA_PYTHON_CLIENT_MEM_FRACTION); on a TPU what the compiler reports as available HBM.
  default_memory_fraction: float = 1.0
  gpu_target_config: str = ''  # GpuTargetConfigProto text (GPUs)
  tpu_chip_config: str = 'default'  # 'megacore' for v4 / v5p (one device per chip)
  spec_source: str = ''

  @property
  def roofline_matmul_flops(self) -> dict[str, float]:
    return {k: v * _MATMUL_FRACTION for k, v in self.matmul_flops.items()}

  @property
  def roofline_hbm_bytes_per_s(self) -> float:
    return self.hbm_bytes_per_s * _HBM_FRACTION

  @property
  def usable_memory_bytes(self) -> int:
    """What XLA may allocate on one device by default (GPU: JAX's preallocated fraction,
    XLA_PYTHON_CLIENT_MEM_FRACTION when set)."""
    fraction = self.default_memory_fraction
    if self.platform == 'cuda' and os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION'):
      fraction = float(os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'])
    return int(self.memory_bytes * fraction)


def _gpu_config(
  *,
  sms: int,
  fp32_lanes: int,
  smem_per_sm: int,
  smem_optin: int,
  l2: int,
  clock_ghz: float,
  memory: int,
  bandwidth: float,
  major: int,
  minor: int,
  description: str,
) -> str:
  """A GpuTargetConfigProto (text format) for XLA:GPU's deviceless compiler."""
  return (
    'gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32 '
    f'shared_memory_per_block: 49152 shared_memory_per_core: {smem_per_sm} '
    f'threads_per_core_limit: 2048 core_count: {sms} fpus_per_core: {fp32_lanes} '
    'block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535 '
    f'memory_bandwidth: {int(bandwidth)} l2_cache_size: {l2} clock_rate_ghz: {clock_ghz} '
    f'device_memory_size: {memory} shared_memory_per_block_optin: {smem_optin} '
    f'cuda_compute_capability {{ major: {major} minor: {minor} }} '
    'registers_per_core_limit: 65536 registers_per_block_limit: 65536 } '
    'runtime_version { major: 12 minor: 8 patch: 0 } platform_name: "CUDA" '
    f'dnn_version_info {{ major: 9 minor: 7 }} device_description_str: "{description}"'
  )


# L2: what a fused Pallas kernel's tile reloads (its stated `l2_bytes`) achieve on Hopper,
# FITTED together with FUSED_KERNEL_EFFICIENCY (below, and its source). For scale: Chips and
# Cheese measured ~5.5 TB/s of L2 load bandwidth on an H100 PCIe (114 SMs at 1.755 GHz;
# "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023; recalled, not re-read), i.e. ~7.2
# TB/s scaled to 132 SMs at 1.98 GHz: the kernels reach 0.44 of that (L2 latency with one or
# two programs an SM and no warp specialisation, a guess at why; not measured).
HOPPER_L2_PEAK_BYTES_PER_S = 5.5e12 * (132 / 114) * (1.98 / 1.755)
HOPPER_L2_FRACTION = 0.44  # fitted
HOPPER_L2_BYTES_PER_S = HOPPER_L2_PEAK_BYTES_PER_S * HOPPER_L2_FRACTION
HOPPER_L2_SOURCE = (
  f'L2 (tile reloads in fused kernels): {HOPPER_L2_FRACTION} of ~7.2 TB/s (Chips and Cheese, '
  'H100 PCIe, scaled to 132 SMs at 1.98 GHz), the fraction fitted like the fused-kernel '
  'efficiency'
)
# Atomics: Triton's `tl.atomic_add` (default semantics acq_rel, gpu scope: what Pallas emits)
# on a GH200 (the H100 SM at 132 SMs) reached 72.9 G 32-bit updates/s with one element per
# thread, a warp covering 128 contiguous bytes (triton-lang/triton PR #10059, 2026-04, its
# microbenchmark; 18.0 G/s where Triton's coalescing split 128-bit per-thread groups into
# scalar atomics). The qk backward adds rows of 64 contiguous float32: the coalesced figure.
HOPPER_ATOMIC_UPDATES_PER_S = 72.86e9
HOPPER_ATOMIC_SOURCE = (
  'atomics: 72.9 G float32-sized updates/s, Triton tl.atomic_add (acq_rel, gpu scope) on a '
  'GH200, coalesced (triton-lang/triton PR #10059)'
)

# Fused Pallas kernels on Hopper: their matmuls plus their CUDA-core work (float, INT32 and
# special-function ops at the rates below), in sequence, take 1 / FUSED_KERNEL_EFFICIENCY of
# that sum. FITTED, with HOPPER_L2_FRACTION, by least squares in log space (a grid of 0.02
# steps) to the nine per-kernel device times an H200 measured (`python -m
# benchmarks.qk_calibration --table --fit` refits them): at L = 16,384 on 2026-11-26 (commit
# 1a0cee4: flash_attention_fwd / _bwd, realformer_qk_attention_fwd / _ds; these four alone
# gave 0.76 and 0.44) and at 65,536 on 2026-11-27 (commit e64cd4c: the same four and
# attention_dropout_mask), and validated on the measured steps (docs/performance.md
# "Calibration"). One constant for every fused kernel is the model's limit: Post-LN's forward
# ran 1.6x faster with 128 x 128 tiles than with 128 x 64 at the same counted work (-30 % and
# +13 % at the fitted value). Refitted ONCE on 2026-11-28 (0.92 -> 0.78) when the kernels'
# integer ops became charged as compiled (aot/hash_work.py: the dropout hash's rotations are
# funnel shifts), then FROZEN: the predictions of every later device run
# (docs/results/device_suite/predictions-*.json) are made with it, and each measured row
# that no fit used is its validation.
FUSED_KERNEL_EFFICIENCY = 0.78
FUSED_KERNEL_EFFICIENCY_SOURCE = (
  f'fused kernels: matmul + CUDA-core work in sequence at {FUSED_KERNEL_EFFICIENCY} of peak, '
  'fitted to the per-kernel splits an H200 measured at L = 16,384 (2026-11-26, commit 1a0cee4) '
  'and 65,536 (2026-11-27, commit e64cd4c), integer ops as compiled; frozen since 2026-11-28'
)


# What a fused kernel's element loops issue (aot/sass.py: SASS instructions per score element,
# times the elements of a call) runs at ISSUE_EFFICIENCY of the schedulers' peak, after its
# matmuls (roofline.kernel_seconds: 'matmul+issue'). FITTED (a grid of 0.02 steps, least
# squares in log space) to the eight per-kernel device times of the kernels whose SASS has an
# element loop (the nine of FUSED_KERNEL_EFFICIENCY but attention_dropout_mask, whose hash-only
# loop has no exponential to count elements by), FUSED_KERNEL_EFFICIENCY and HOPPER_L2_FRACTION
# held at their frozen values; each row's leave-one-out error is in docs/performance.md
# ("Instructions"; `python -m benchmarks.sass_calibration` refits it).
ISSUE_EFFICIENCY = 0.66
ISSUE_EFFICIENCY_SOURCE = (
  f"fused kernels with SASS: matmul, then the element loops' instructions at {ISSUE_EFFICIENCY} "
  'of 4 warp instructions an SM a clock, fitted to the per-kernel splits an H200 measured '
  '(2026-11-26 and -27, commits 1a0cee4 and e64cd4c)'
)


def _nvidia(*, sms: int, clock: float, fp32_lanes: int, memory: int, bandwidth: float,
            device: str, target: dict, **fields) -> Chip:  # fmt: skip
  """An NVIDIA GPU of `sms` SMs at `clock` GHz: its CUDA cores per SM and clock (CUDA C++
  Programming Guide, arithmetic instruction throughput: `fp32_lanes` float32, 64 32-bit
  integer, 16 special-function) and the deviceless compiler's target (`target`: _gpu_config's
  shared memory, L2 and compute capability; `device`: the driver's device name)."""
  facts = dict(sms=sms, clock_ghz=clock, memory=memory, bandwidth=bandwidth)
  return Chip(
    platform='cuda',
    memory_bytes=memory,
    hbm_bytes_per_s=bandwidth,
    launch_overhead_s=2e-6,
    vector_flops=sms * fp32_lanes * clock * 1e9,
    vector_int_ops=sms * 64 * clock * 1e9,
    transcendentals=sms * 16 * clock * 1e9,
    sms=sms,
    default_memory_fraction=0.75,
    gpu_target_config=_gpu_config(fp32_lanes=fp32_lanes, description=device, **facts, **target),
    **fields,
  )


def _hopper(name: str, description: str, memory: int, bandwidth: float, device: str) -> Chip:
  """An SXM Hopper GPU: 132 SMs at 1.98 GHz, the same tensor cores; H100 and H200 differ in HBM
  (80 GB HBM3 at 3.35 TB/s vs 141 GB HBM3e at 4.8 TB/s) only."""
  sms, clock = 132, 1.98
  return _nvidia(
    sms=sms,
    clock=clock,
    fp32_lanes=128,
    memory=memory,
    bandwidth=bandwidth,
    device=device,
    target=dict(smem_per_sm=233472, smem_optin=232448, l2=52_428_800, major=9, minor=0),
    name=name,
    description=description,
    matmul_flops={
      'fp8': 1979 * TERA,
      'int8': 1979 * TERA,
      'bf16': 989.4 * TERA,
      'tf32': 494.7 * TERA,
      'f32': 66.9 * TERA,
    },
    interconnect_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional per GPU
    l2_bytes_per_s=HOPPER_L2_BYTES_PER_S,
    atomic_updates_per_s=HOPPER_ATOMIC_UPDATES_PER_S,
    fused_kernel_efficiency=FUSED_KERNEL_EFFICIENCY,
    issue_per_s=sms * 4 * 32 * clock * 1e9,
    issue_efficiency=ISSUE_EFFICIENCY,
    spec_source=f'NVIDIA {name.upper()} Tensor Core GPU datasheet (SXM): 989.4 TFLOP/s dense '
    f'bf16, 494.7 TF32, 66.9 FP32, {bandwidth / 1e12:.2f} TB/s HBM, 900 GB/s NVLink; 132 SMs; '
    f'{HOPPER_L2_SOURCE}; {HOPPER_ATOMIC_SOURCE}; {FUSED_KERNEL_EFFICIENCY_SOURCE}; '
    f'{ISSUE_EFFICIENCY_SOURCE}',
  )


def _h100() -> Chip:
  # 79.1 GiB as the driver reports; HBM3
  return _hopper('h100', 'NVIDIA H100 SXM 80GB', 84_929_347_584, 3.35e12, 'NVIDIA H100 80GB HBM3')


def _h200() -> Chip:
  # 143,771 MiB as the driver reports (~140 GiB); HBM3e
  return _hopper('h200', 'NVIDIA H200 SXM 141GB', 143_771 * 2**20, 4.8e12, 'NVIDIA H200')


def _a100(memory_gb: int) -> Chip:
  bandwidth = 1.555e12 if memory_gb == 40 else 2.039e12
  return _nvidia(
    sms=108,
    clock=1.41,
    fp32_lanes=64,
    memory=memory_gb * GiB,  # 40960 / 81920 MiB (nvidia-smi)
    bandwidth=bandwidth,
    device=f'NVIDIA A100-SXM4-{memory_gb}GB',
    target=dict(smem_per_sm=167936, smem_optin=166912, l2=41_943_040, major=8, minor=0),
    name=f'a100-{memory_gb}g',
    description=f'NVIDIA A100 SXM {memory_gb}GB',
    matmul_flops={
      'int8': 624 * TERA,
      'bf16': 312 * TERA,
      'tf32': 156 * TERA,
      'f32': 19.5 * TERA,
      'fp8': 312 * TERA,
    },  # no fp8 units: bf16 rate
    interconnect_bytes_per_s=300 * GB,  # NVLink 3: 600 GB/s bidirectional per GPU
    spec_source=f'NVIDIA A100 Tensor Core GPU datasheet (SXM4 {memory_gb}GB): 312 TFLOP/s '
    f'dense bf16, 156 TF32, 19.5 FP32, {bandwidth / 1e12:.3f} TB/s HBM, '
    '600 GB/s NVLink; 108 SMs',
  )


def _tpu(
  name: str,
  description: str,
  memory_gib: float,
  available_gib: float,
  bf16_tflops: float,
  hbm_gbps: float,
  ici_gbps: float,
  int8_tops: float,
  megacore: bool,
) -> Chip:
  bf16 = bf16_tflops * TERA
  return Chip(
    name=name,
    platform='tpu',
    description=description,
    memory_bytes=int(memory_gib * GiB),
    hbm_bytes_per_s=hbm_gbps * GB,
    default_memory_fraction=available_gib / memory_gib,
    # float32 dots: 1 bf16 pass at default precision, 6 at 'highest'.
    matmul_flops={
      'bf16': bf16,
      'tf32': bf16,
      'f32': bf16 / 6,
      'fp8': int8_tops * TERA,
      'int8': int8_tops * TERA,
    },
    interconnect_bytes_per_s=ici_gbps * GB,
    launch_overhead_s=0.0,
    tpu_chip_config='megacore' if megacore else 'default',
    spec_source=f'Google Cloud TPU {name} system architecture: {bf16_tflops} TFLOP/s bf16, '
    f'{hbm_gbps:.0f} GB/s HBM, {memory_gib} GiB per chip',
  )


# TPU figures per chip from the Cloud TPU pages (ICI: half the bidirectional figure); the
# available HBM (second number, GiB) is what XLA:TPU (libtpu 0.0.42.1) reports when a program is
# too large ('exceeds available HBM (15.75G)' on a v5e). v5p: the pages say 95 GB / 95 GiB; its
# compiler offers 95.74 GiB, so the chip has 96 GiB.
CHIPS: dict[str, Chip] = {
  'h100': _h100(),
  'h200': _h200(),
  'a100-40g': _a100(40),
  'a100-80g': _a100(80),
  'v4': _tpu('v4', 'TPU v4', 32, 30.75, 275, 1228, 300, 275, megacore=True),
  'v5e': _tpu('v5e', 'TPU v5e', 16, 15.75, 197, 819, 200, 393, megacore=False),
  'v5p': _tpu('v5p', 'TPU v5p', 96, 95.74, 459, 2765, 600, 918, megacore=True),
  'v6e': _tpu('v6e', 'TPU v6e (Trillium)', 32, 31.25, 918, 1638, 400, 1836, megacore=False),
}
GPUS_PER_HOST = 8
# jax's device_kind (a substring of it) -> CHIPS key, most specific first: which chip's rates a
# measurement on this device is set beside.
DEVICE_KINDS = (
  ('H200', 'h200'),
  ('H100', 'h100'),
  ('A100-SXM4-40GB', 'a100-40g'),
  ('A100', 'a100-80g'),
  ('TPU v5 lite', 'v5e'),
  ('TPU v6 lite', 'v6e'),
  ('TPU v5', 'v5p'),
  ('TPU v4', 'v4'),
)


def chip_of_device_kind(device_kind: str) -> Optional[Chip]:
  """The chip of a device jax reports as `device_kind` ('NVIDIA H200'), or None."""
  name = next((chip for kind, chip in DEVICE_KINDS if kind in device_kind), None)
  return CHIPS[name] if name else None


def mfu_peak_flops(chip: Chip) -> float:
  """The ONE peak every MFU figure of the project is quoted against, measured or estimated:
  the chip's datasheet dense bf16 matmul rate (989.4 TFLOP/s for an H100 or H200 SXM), never a
  measured matmul or the roofline's derated rate."""
  return chip.matmul_flops['bf16']


@dataclasses.dataclass(frozen=True)
class Target:
  """A chip and how many of them, as one compile target."""

  chip: Chip
  spec: str  # as given: 'h100:8', 'v5e:2x2'
  topology: str  # GPU: slices x hosts x devices ('1x1x8'); TPU: jax's name ('v5e:2x2')
  num_devices: int

  @property
  def platform(self) -> str:
    return self.chip.platform

  def describe(self) -> str:
    return f'{self.num_devices} x {self.chip.description} ({self.spec})'

  def devices(self) -> list:
    """Compile-only devices for this target (no hardware needed)."""
    return list(_topology(self).devices)


def parse(spec: str) -> Target:
  """'h100:8', 'a100-40g:16', 'a100-80g', 'v5e:2x2', 'v4:2x2x1', ... -> Target. A one-line
  ConfigError names what is wrong."""
  name, _, rest = spec.strip().lower().partition(':')
  if name not in CHIPS:
    raise ConfigError(
      f'--target={spec}: unknown accelerator {name!r} (known: '
      f'{", ".join(CHIPS)}; e.g. h100:8, a100-40g:16, v5e:2x2, v4:2x2x1)'
    )
  chip = CHIPS[name]
  if chip.platform == 'cuda':
    count = rest or '1'
    if not count.isdigit() or int(count) < 1:
      raise ConfigError(f'--target={spec}: a GPU target is NAME:COUNT, e.g. {name}:8')
    n = int(count)
    if n > GPUS_PER_HOST and n % GPUS_PER_HOST:
      raise ConfigError(
        f'--target={spec}: more than {GPUS_PER_HOST} GPUs must be whole hosts of {GPUS_PER_HOST}'
      )
    hosts = max(1, n // GPUS_PER_HOST)
    return Target(chip, spec, f'1x{hosts}x{n // hosts}', n)
  dims = rest.split('x') if rest else []
  if not dims or not all(d.isdigit() and int(d) > 0 for d in dims) or len(dims) not in (2, 3):
    example = 'v5e:2x2' if name in ('v5e', 'v6e') else f'{name}:2x2x1'
    raise ConfigError(f'--target={spec}: a TPU target is {name}:TOPOLOGY in chips, e.g. {example}')
  return Target(chip, spec, f'{name}:{rest}', math.prod(int(d) for d in dims))


def _topology(target: Target):
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  # libtpu holds a machine-wide lock file (/tmp/libtpu_lockfile) so that two processes cannot
  # share a TPU; compiling for a topology opens no TPU, so several processes may load it.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  try:
    if target.platform == 'cuda':
      return topologies.get_topology_desc(
        target.chip.name,
        'cuda',
        target_config=target.chip.gpu_target_config,
        topology=target.topology,
      )
    # Hosts of up to 2x2x1 chips (as Cloud TPU VMs and MaxText lay them out); smaller
    # topologies are one host.
    dims = [int(d) for d in target.topology.split(':')[1].split('x')] + [1]
    bounds = tuple(min(b, d) for b, d in zip((2, 2, 1), dims))
    return topologies.get_topology_desc(
      platform='tpu',
      topology_name=target.topology,
      chip_config_name=target.chip.tpu_chip_config,
      chips_per_host_bounds=bounds,
      num_slices=1,
    )
  except Exception as e:  # the plugin missing, or a topology XLA does not accept
    package = 'jax-cuda13-plugin' if target.platform == 'cuda' else 'libtpu'
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(
      f'--target={target.spec}: cannot describe the {target.chip.description} '
      f'devices ({message}); the compiler comes with {package}: pip install '
      f"-e '.[aot]', and run with JAX_PLATFORMS=cpu"
    ) from e


def known_targets() -> str:
  return ', '.join(CHIPS)


def dtype_class(dtype: str, precision: Optional[str], platform: str) -> str:
  """Which matmul peak a dot with operands of `dtype` runs at (see Chip.matmul_flops)."""
  if dtype in ('bf16', 'f16'):
    return 'bf16'
  if dtype.startswith('f8'):
    return 'fp8'
  if dtype in ('s8', 'u8', 's4', 'u4'):
    return 'int8'
  if dtype == 'f32':
    if precision and re.search(r'highest|f32_f32_f32', precision):
      return 'f32'
    # Default precision: TF32 tensor cores on a GPU, one bf16 pass on a TPU's MXU.
    return 'bf16' if platform == 'tpu' else 'tf32'
  return 'f32'
