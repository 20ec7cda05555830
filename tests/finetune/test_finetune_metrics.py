"""GLUE and SQuAD metrics against hand-computed cases and the official SQuAD normalisation."""

import math

import numpy as np
import pytest

from realformer_jax.finetune import metrics


def test_classification_metrics_by_hand():
  # Confusion (label, prediction): TP 3, TN 2, FP 1, FN 1.
  labels = np.array([1, 1, 1, 1, 0, 0, 0])
  predictions = np.array([1, 1, 1, 0, 0, 0, 1])
  assert metrics.accuracy(predictions, labels) == pytest.approx(5 / 7)
  # precision 3/4, recall 3/4
  assert metrics.binary_f1(predictions, labels) == pytest.approx(0.75)
  # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (6 - 1) / sqrt(4*4*3*3) = 5/12
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(5 / 12)
  # Constant predictions: Matthews 0 (GLUE's convention), F1 of a never-predicted class 0.
  assert metrics.matthews_corrcoef(np.zeros(7), labels) == 0.0
  assert metrics.binary_f1(np.zeros(7), labels) == 0.0


def test_multiclass_matthews_by_hand():
  # Gorodkin's R_K from its definition: cov(X, Y) / sqrt(cov(X, X) cov(Y, Y)) over one-hot
  # rows, with cov(X, Y) = sum_k cov(X_k, Y_k).
  labels = np.array([0, 0, 1, 1, 2, 2, 2, 1])
  predictions = np.array([0, 1, 1, 1, 2, 0, 2, 2])
  x, y = np.eye(3)[predictions], np.eye(3)[labels]

  def cov(a, b):
    return np.sum((a - a.mean(0)) * (b - b.mean(0)))

  expected = cov(x, y) / math.sqrt(cov(x, x) * cov(y, y))
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(expected)


def test_correlations_by_hand():
  x = np.array([1.0, 2.0, 3.0, 4.0])
  y = np.array([2.0, 1.0, 4.0, 3.0])
  # dx = dy-pattern: sum(dx*dy) = 3, sum(dx^2) = sum(dy^2) = 5
  assert metrics.pearson(x, y) == pytest.approx(3 / 5)
  assert metrics.spearman(x, y**3) == pytest.approx(3 / 5)  # ranks only
  # Ties share their average rank: y ranks (1.5, 1.5, 3, 4)
  ranks_y = np.array([1.5, 1.5, 3.0, 4.0])
  tied = np.array([5.0, 5.0, 7.0, 9.0])
  dx, dy = x - x.mean(), ranks_y - ranks_y.mean()
  expected = np.sum(dx * dy) / math.sqrt(np.sum(dx**2) * np.sum(dy**2))
  assert metrics.spearman(x, tied) == pytest.approx(expected)
  assert metrics.pearson(x, np.ones(4)) == 0.0


@pytest.mark.parametrize(
  'text, normalized',
  [
    ('The Eiffel Tower!', 'eiffel tower'),
    ('  an   apple, a pear; the end. ', 'apple pear end'),
    ('Theatre then', 'theatre then'),  # articles only as whole words
    ("Denver Broncos'", 'denver broncos'),
    ('A', ''),
  ],
)
def test_squad_normalisation_follows_the_official_script(text, normalized):
  assert metrics.normalize_answer(text) == normalized


def test_squad_exact_match_and_f1_by_hand():
  assert metrics.exact_match('the Denver Broncos', 'Denver Broncos') == 1.0
  # prediction tokens {denver, broncos, team}, gold {denver, broncos}: P 2/3, R 1, F1 0.8
  assert metrics.token_f1('Denver Broncos team', 'the Denver Broncos') == pytest.approx(0.8)
  assert metrics.token_f1('Broncos Broncos', 'Broncos') == pytest.approx(2 / 3)  # multiset
  assert metrics.token_f1('', '') == 1.0 and metrics.token_f1('x', '') == 0.0
  scores = metrics.squad_scores(
    ['Denver Broncos team', '', 'Paris', 'blue'],
    [['Denver Broncos', 'the Broncos'], [], ['paris', 'Paris, France'], ['']],
  )
  # per question: EM (0, 1, 1, 0), F1 (0.8 best over golds, 1, 1, 0); questions 2 and 4 have
  # no answer (an all-article / empty gold counts as none)
  assert scores['exact_match'] == pytest.approx(50.0)
  assert scores['f1'] == pytest.approx(100 * 2.8 / 4)
  assert scores['has_answer_f1'] == pytest.approx(90.0)
  assert scores['no_answer_f1'] == pytest.approx(50.0)
