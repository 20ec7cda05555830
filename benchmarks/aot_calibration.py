"""How far the roofline estimate can be trusted: the code that issue 11 profiled on an H100,
compiled for an H100 here and estimated, beside what that profile measured.

    python -m benchmarks.aot_calibration     # ~5 min on 2 CPU cores (two compiles)

Issue 11 (an earlier session, one H100 80GB, jax 0.11.2) measured BERT-Base 32 x 512, bf16,
dropout 0.1, the project's train step with the rolled layer scan against Hugging Face's
FlaxBertForMaskedLM in the same optimizer step, with a profiler trace of two steps; its figures
are quoted below as that issue gives them (ms per step) and were not measured again here. The
code it ran is commit CALIBRATION_COMMIT (the parent of the first change made in answer to it:
the one-hot segment embedding). This script extracts that commit with `git archive`, compiles its
two steps for an H100 in a subprocess started inside the extracted tree (JAX_PLATFORMS=cpu), and
runs today's estimator (realformer_jax/aot/roofline.py) over them. Results:
docs/results/aot/calibration/ (results.md, results.json).
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import textwrap

from realformer_jax.aot import categories, roofline, targets
from realformer_jax.studies import runs as runs_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
CALIBRATION_COMMIT = '9be1ff67f2b41b0086199003eb759602ed004392'
OUT_DIR = REPO / 'docs' / 'results' / 'aot' / 'calibration'
TARGET = 'h100:1'
SCORE_DIMS = (512, 512)

# Issue 11's H100 profile of that code (ms per step, BERT-Base 32 x 512, bf16): kernel time of
# a profiler trace, by what the kernels did, and the benchmark's median step times.
MEASURED = {
  'post': {
    'scatter': 50.2,
    'copies': 20.0,
    'score_non_gemm': 38.7,
    'gemm': 23.0,
    'optimizer': 1.9,
    'kernel_total': 128.0,
    'step_median': 113.0,
  },
  'hf': {
    'scatter': 39.7,
    'copies': 0.0,
    'score_non_gemm': 13.1,
    'gemm': 23.5,
    'optimizer': 2.0,
    'kernel_total': 90.0,
    'step_median': 99.0,
  },
}
ROWS = (
  ('gemm', 'all GEMMs (cuBLAS + Triton)'),
  ('score_non_gemm', 'every non-GEMM kernel on a [32,12,512,512] score tensor'),
  ('copies', "copies / zero-fills / dynamic-(update-)slices (the rolled scan's stacking)"),
  ('optimizer', 'optimizer'),
  ('scatter', 'token-type embedding gradient: atomic scatter of 16,384 rows into 2'),
  ('without_scatter', 'whole step without that scatter'),
)

# Runs inside the extracted old tree: its own benchmarks.steps and realformer_jax.train, on the
# devices of the H100 topology (argv: candidate, output path, GpuTargetConfigProto text).
_COMPILE_OLD_CODE = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
    from benchmarks import steps
    from realformer_jax import train as train_lib
    from realformer_jax.train import partitioning, state as state_lib, step as step_lib
    from realformer_jax.train import validation

    which, out_path, target_config = sys.argv[1:4]
    devices = topologies.get_topology_desc('h100', 'cuda', target_config=target_config,
                                           topology='1x1x1').devices

    def make_mesh(mesh_config):  # that code's mesh, on the H100 instead of this host's CPU
      shape = validation.resolve_mesh_shape(mesh_config, len(devices))
      return jax.make_mesh(shape, tuple(mesh_config.axes),
                           axis_types=(AxisType.Auto,) * len(shape), devices=devices)

    partitioning.make_mesh = make_mesh
    shape = steps.Shape('bert_base_512', hidden=768, layers=12, heads=12, vocab=30522,
                        seq_len=512, batch=32, predictions=80)
    batch = steps.make_batch(shape)
    key = jax.eval_shape(jax.random.key, 0)
    spec = lambda tree, s: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)
    if which == 'hf':
      import transformers
      hf = transformers.FlaxBertForMaskedLM(steps.hf_bert_config(shape, dropout=0.1), seed=1,
                                            dtype=jnp.bfloat16, _do_init=False)
      config = steps.train_config(shape, dropout=0.1)
      tx = state_lib.make_optimizer(config.train)
      fn = jax.jit(step_lib.make_train_step(steps.HFMaskedLM(hf), tx, config.train),
                   donate_argnums=0)
      def init(rng):
        params = hf.init_weights(rng, (1, shape.seq_len))
        return state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                    opt_state=tx.init(params))
      s = NamedSharding(Mesh(devices, ('d',)), PartitionSpec())
      lowered = fn.lower(spec(jax.eval_shape(init, jax.random.key(1)), s), spec(batch, s),
                         jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=s))
    else:
      config = steps.train_config(shape, ln_placement=which, dropout=0.1, dtype='bfloat16')
      setup = train_lib.make_setup(config)
      fn = jax.jit(step_lib.make_train_step(setup.model, setup.tx, config.train,
                                            setup.layout.param_shardings),
                   in_shardings=(setup.layout.shardings, setup.batch_sharding, setup.replicated),
                   out_shardings=(setup.layout.shardings, setup.replicated), donate_argnums=0)
      with partitioning.activate(setup.mesh, setup.rules):
        lowered = fn.lower(setup.layout.abstract, spec(batch, setup.batch_sharding),
                           jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=setup.replicated))
    with open(out_path, 'w') as f:
      f.write(lowered.compile().as_text())
""")


def extract(commit: str, directory: str) -> None:
  archive = subprocess.run(
    ['git', '-C', str(REPO), 'archive', '--format=tar', commit], check=True, capture_output=True
  ).stdout
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(directory, filter='data')


def compile_in_tree(code: str, args: list[str], tree: str, what: str) -> None:
  """Runs the compile script `code` with `args` inside `tree` (an extracted commit, see
  extract): on the CPU, writing no bytecode into the tree; a failure raises naming `what`,
  with the end of the script's stderr."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONDONTWRITEBYTECODE='1')
  done = subprocess.run(
    [sys.executable, '-c', code, *args], cwd=tree, env=env, capture_output=True, text=True
  )
  if done.returncode:
    raise RuntimeError(f'compiling {what} failed:\n' + done.stderr[-3000:])


def compile_old(which: str, tree: str, out_path: str) -> None:
  chip = targets.parse(TARGET).chip
  args = [which, out_path, chip.gpu_target_config]
  compile_in_tree(_COMPILE_OLD_CODE, args, tree, f'{which} at {CALIBRATION_COMMIT[:7]}')


def estimated_rows(hlo: str) -> dict:
  """The estimate in the profile's rows (ms per step)."""
  est = roofline.estimate(hlo, targets.parse(TARGET), score_dims=SCORE_DIMS)
  ms = lambda kernels: sum(k.total_seconds for k in kernels) * 1e3
  kernels = est.kernels
  return {
    'gemm': ms(k for k in kernels if k.category == categories.GEMM),
    'score_non_gemm': ms(k for k in kernels if k.score_sized and k.category != categories.GEMM),
    'copies': ms(k for k in kernels if k.category == categories.COPIES),
    'optimizer': ms(k for k in kernels if k.category == categories.OPTIMIZER),
    'scatter': ms(k for k in kernels if k.category == categories.SCATTER),
    'without_scatter': ms(k for k in kernels if k.category != categories.SCATTER),
    'warnings': list(est.warnings),
    'launches': est.launches,
  }


def render(results: dict) -> str:
  lines = [
    "# Calibration: the roofline estimate vs issue 11's H100 profile",
    '',
    f'Code of commit `{CALIBRATION_COMMIT[:7]}` (what issue 11 profiled), BERT-Base 32 x 512, '
    'bf16, dropout 0.1, rolled layer scan, one H100. "estimated": compiled for an H100 on a '
    'CPU host and read by realformer_jax/aot/roofline.py (ms per step). "measured": issue '
    "11's profiler trace on an H100 in an earlier session, quoted, not re-measured. The "
    "trace's categories overlap (a copy of a score tensor is in both of its rows), and so do "
    'these.',
    '',
    '| ms per step | ours post: estimated | ours post: measured | HF: estimated | HF: measured |',
    '|---|---:|---:|---:|---:|',
  ]
  for key, label in ROWS:
    cells = []
    for which in ('post', 'hf'):
      measured = MEASURED[which]
      value = (
        measured['kernel_total'] - measured['scatter']
        if key == 'without_scatter'
        else measured[key]
      )
      note = (
        ' (trace total ~{:.0f} - {:.1f})'.format(measured['kernel_total'], measured['scatter'])
        if key == 'without_scatter'
        else ''
      )
      estimated = results[which][key]
      cells += [
        f'{estimated:.1f}' + (' + warning' if key == 'scatter' else ''),
        f'{"~" if key in ("copies", "without_scatter") else ""}{value:.1f}{note}',
      ]
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    'Estimated kernel launches: '
    + ', '.join(f'{which} {results[which]["launches"]:,}' for which in ('post', 'hf'))
    + '.',
    '',
    'Warnings the estimator raised:',
    '',
  ]
  lines += [f'- {which}: {w}' for which in ('post', 'hf') for w in results[which]['warnings']]
  return '\n'.join(lines) + '\n'


def main() -> dict:
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    tree = os.path.join(scratch, 'tree')
    extract(CALIBRATION_COMMIT, tree)
    for which in ('post', 'hf'):
      print(f'compiling {which} at {CALIBRATION_COMMIT[:7]} for an H100 ...', flush=True)
      path = os.path.join(scratch, f'{which}.hlo')
      compile_old(which, tree, path)
      results[which] = estimated_rows(pathlib.Path(path).read_text())
  runs_lib.write_json(
    str(OUT_DIR / 'results.json'),
    {
      'commit': CALIBRATION_COMMIT,
      'target': TARGET,
      'estimated': results,
      'measured_issue_11': MEASURED,
    },
  )
  text = render(results)
  (OUT_DIR / 'results.md').write_text(text)
  print(text)
  return results


if __name__ == '__main__':
  argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help; no options
  main()
