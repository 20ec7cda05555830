r"""Run a declared study plan: train what it lists (resumably, with progress and ETA), then
report it.

    python -m experiments.study --plan=tuned_rates                     # train all, then report
    python -m experiments.study --plan=tuned_rates --runs='*-s[0246]'  # one process's share
    python -m experiments.study --plan=tuned_rates --runs=none         # the report only
    python -m experiments.study --plan=tuned_rates --quick --out=/tmp/tr   # toy smoke run

A plan is `studies/plans/<NAME>.py` (or any file's path) defining PLANS = {scale: Plan}.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from realformer_jax.studies import runner
from realformer_jax.studies import runs as runs_lib


def parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--plan', required=True, help='a name in studies/plans/ or a .py path')
  parser.add_argument('--scale', default='cpu', help="the plan's scale (PLANS key)")
  parser.add_argument('--quick', action='store_true', help='the toy scale: a smoke run')
  parser.add_argument('--out', default='', help="the report's folder (default: the plan's)")
  parser.add_argument('--store', default='', help="runs/<name>.json (default: the plan's)")
  parser.add_argument('--workdirs', default='', help="checkpoints (default: the plan's)")
  parser.add_argument('--data_dir', default='', help="TFDS data dir (default: the config's)")
  parser.add_argument(
    '--runs', default='*', help="comma-separated globs of run names to train now; 'none': report"
  )
  return parser.parse_args(argv)


def main(argv=None):
  args = parse(argv)
  try:
    plan = runner.load_plan(args.plan, 'toy' if args.quick else args.scale)
  except (ValueError, FileNotFoundError) as error:
    sys.exit(f'error: {error}')
  # JAX from here on, not before: a mistyped --plan is one line at once (studies/runner.py).
  from realformer_jax.train import workdir_lock  # pylint: disable=import-outside-toplevel

  changes = {k: getattr(args, k) for k in ('out', 'store', 'workdirs') if getattr(args, k)}
  if args.out and not args.store:
    changes['store'] = args.out
  plan = dataclasses.replace(plan, **changes)
  if not plan.out or not plan.workdirs:
    sys.exit(f'error: --out and --workdirs: plan {plan.name} at this scale names no default')
  try:
    for flag in ('out', 'store', 'workdirs'):  # a path through a file: one line, not a traceback
      if getattr(plan, flag):
        workdir_lock.check_usable(getattr(plan, flag), f'--{flag}')
    runner.check_selection(plan, args.runs, plan.store or plan.out)
  except (ValueError, workdir_lock.WorkdirError) as error:  # runs_lib.ResultError among them
    sys.exit(f'error: {error}')
  try:
    results = runner.train(plan, runs=args.runs, data_dir=args.data_dir)
  except runs_lib.ResultError as error:
    sys.exit(f'error: {error}')
  except KeyboardInterrupt:  # the training loop saved first (one Ctrl-C), then re-raised
    print(
      f'interrupted: finished runs are in {plan.store or plan.out}/runs; the same command '
      'resumes each unfinished run from its last checkpoint',
      file=sys.stderr,
    )
    sys.exit(130)
  command = f'python -m experiments.study --plan={args.plan}'
  command += ' --quick' if args.quick else ('' if args.scale == 'cpu' else f' --scale={args.scale}')
  analysis = runner.report(plan, results, command)
  return {'plan': plan, 'results': results, 'analysis': analysis}


if __name__ == '__main__':
  main(sys.argv[1:])
