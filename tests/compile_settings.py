"""The suite's cheap-compile XLA:CPU setting, for the test processes and every process they start.

Compile time dominates these tiny programs on 2 cores. XLA:CPU's MLIR fusion emitters (its
default) compile a toy train step in about twice the CPU of the older elemental emitters: 7.5 s
instead of 11.5 s for trace + lower + compile of a 2-layer, hidden-48 RealFormer step with
`jax_disable_most_optimizations` (measured 2026-11-27, A/B back to back, load average 8). Both
emitters compute the same HLO program; only the machine code differs. It is an XLA:CPU flag, so
deviceless compiles for a GPU or TPU (the AOT tests and benchmarks) are unaffected.

conftest.py puts it in XLA_FLAGS before JAX starts, so subprocesses that copy os.environ inherit
it; a test that writes its own XLA_FLAGS (forced device counts) builds them with `xla_flags`,
or takes the whole environment of a forced-CPU-device subprocess from `cpu_devices_env`.
"""

import os

CHEAP_CPU_COMPILE = ('--xla_cpu_use_fusion_emitters=false',)


def xla_flags(*flags: str, base: str = '') -> str:
  """XLA_FLAGS of `base` (a previous value) and `flags`, with the cheap-compile setting."""
  words = base.split()
  return ' '.join(words + [f for f in (*CHEAP_CPU_COMPILE, *flags) if f not in words])


def export() -> None:
  """Adds the setting to this process's XLA_FLAGS (before JAX creates its CPU client)."""
  os.environ['XLA_FLAGS'] = xla_flags(base=os.environ.get('XLA_FLAGS', ''))


def cpu_devices_env(num_devices: int) -> dict[str, str]:
  """This process's environment for a subprocess on `num_devices` forced CPU devices (also on a
  machine with an accelerator), with the cheap-compile setting."""
  return dict(
    os.environ,
    XLA_FLAGS=xla_flags(f'--xla_force_host_platform_device_count={num_devices}'),
    JAX_PLATFORMS='cpu',
  )
