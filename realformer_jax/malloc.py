"""glibc malloc settings for XLA:CPU processes.

XLA:CPU allocates every step's temporaries afresh (BERT-Base: ~1.2-1.7 GB per train step).
glibc serves blocks that large with mmap and unmaps them on free, so by default every step
page-faults its whole temp buffer again (4 KiB pages: ~300k faults and up to a second of kernel
time per BERT-Base step on 2 cores). 'retain' keeps freed memory in the heap (one arena, no mmap,
no trim): after the first steps no step faults, 21% faster BERT-Base steps measured
(benchmarks/README.md); the heap keeps its high-water mark. 'hugepages' faults 2 MiB pages
instead (512x fewer faults, but the kernel still zeroes every page every step).

glibc reads GLIBC_TUNABLES once, at process start, so a process that wants them re-executes
itself (same PID, same command line) with the variable set: `reexec_with(mode)`.
"""

import os
import sys
from typing import Optional

TUNABLES = {
  'default': '',
  'retain': 'glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:'
  'glibc.malloc.trim_threshold=1152921504606846976',
  'hugepages': 'glibc.malloc.hugetlb=1',
}


def environment(mode: str) -> Optional[dict]:
  """The environment to re-run under for `mode`, or None if this process already has it (or
  the platform is not glibc Linux, or the mode changes nothing)."""
  if mode not in TUNABLES:
    raise ValueError(f'malloc mode {mode!r}: must be one of {", ".join(TUNABLES)}')
  tunables = TUNABLES[mode]
  current = os.environ.get('GLIBC_TUNABLES', '')
  if not sys.platform.startswith('linux') or not tunables or tunables in current:
    return None
  return dict(os.environ, GLIBC_TUNABLES=':'.join(t for t in (current, tunables) if t))


def reexec_with(mode: str) -> None:
  """Replaces this process by the same command line under `mode`'s tunables, if needed.

  Call it before doing any work: nothing of this process survives but its PID.
  """
  env = environment(mode)
  if env is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
