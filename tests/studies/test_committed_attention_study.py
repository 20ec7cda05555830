"""The attention analysis, once a script, runs through the one runner as a declared plan
(studies/plans/attention_analysis.py: trainer and report 'attention', a run per layouts
checkpoint) and reproduces its committed results exactly from the committed per-run JSON (split
from the script's one file): the whole analysis in results.json and the whole results.md but for
its command line. No analysis of a checkpoint."""

from committed_plans import analysis_is_committed, committed, markdown_is_committed

from realformer_jax.studies import attention_analysis


def test_the_attention_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan, results = committed('attention_analysis')
  assert sorted(results) == sorted(f'{l}-s{s}' for l in ('post', 'realformer') for s in range(4))
  analysis = analysis_is_committed(plan, results)
  assert analysis['rate'] == 0.002 and analysis['paired_seeds'] == [0, 1, 2, 3]
  verdicts = {row['key']: row['verdict'] for row in analysis['claims']}
  assert verdicts == {'5a': 'inconclusive', '5b': 'inconclusive', '5c': 'holds'}
  attention_analysis.write_markdown(str(tmp_path / 'results.md'), plan, analysis, 'CMD')
  markdown_is_committed(
    str(tmp_path / 'results.md'), plan, 'python -m experiments.study --plan=attention_analysis'
  )


def test_the_depth_attention_plan_reproduces_each_analysed_depth(tmp_path):
  """The depth study's attention analysis (studies/plans/attention_depth.py) from its committed
  per-model JSON: the index's whole analysis, and each analysed depth's results.md."""
  plan, results = committed('attention_depth')
  analysis = analysis_is_committed(plan, results)
  analysed = [tag for tag, part in analysis['tags'].items() if part['seeds']]
  assert 'L6-' in analysed  # its 12 pretraining runs are committed
  for tag in analysed:
    part = attention_analysis.of_tag(plan, tag)
    attention_analysis.write_markdown(
      str(tmp_path / 'results.md'), part, analysis['tags'][tag], 'CMD'
    )
    markdown_is_committed(
      str(tmp_path / 'results.md'), part, 'python -m experiments.study --plan=attention_depth'
    )
