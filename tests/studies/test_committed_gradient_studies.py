"""The gradient-norm study and the init sweep, once scripts, run through the one runner as
declared plans (studies/plans/grad_norms.py, init_grad_sweep.py: their own trainers and reports)
and reproduce their committed results exactly from the committed per-run JSON (split from the
scripts' one file each): the whole analysis in results.json and the whole results.md but for its
command line. No training."""

from committed_plans import analysis_is_committed, committed, markdown_is_committed

from realformer_jax.studies import grad_norms, init_sweep


def test_the_grad_norms_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan, results = committed('grad_norms')
  assert sorted(results) == sorted(
    f'{v}-s0' for v in ('post', 'pre', 'realformer', 'post+ds_init', 'rezero')
  )
  analysis = analysis_is_committed(plan, results)
  # The report's wall time is the runs' own seconds added up (the script's 551 s also held
  # its data preparation).
  assert round(analysis['wall_seconds']) == 549
  assert analysis['variants']['rezero']['first_over_last']['attention'][0] is None  # gates 0
  runs_by_variant = grad_norms.variant_runs(plan, results)
  grad_norms.write_markdown(str(tmp_path / 'results.md'), plan, runs_by_variant, analysis, 'CMD')
  markdown_is_committed(
    str(tmp_path / 'results.md'), plan, 'python -m experiments.study --plan=grad_norms'
  )


def test_the_init_sweep_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan, results = committed('init_grad_sweep')
  assert len(results) == 9
  analysis = analysis_is_committed(plan, results)
  # The script timed its nine settings together: the runs split from its file carry that total.
  assert round(analysis['seconds']) == 105
  assert analysis['settings']['bert-init']['attention_first_over_last'] < 1  # no vanishing
  init_sweep.write_markdown(str(tmp_path / 'results.md'), plan, analysis, 'CMD')
  markdown_is_committed(
    str(tmp_path / 'results.md'), plan, 'python -m experiments.study --plan=init_grad_sweep'
  )
