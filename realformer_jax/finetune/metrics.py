"""GLUE and SQuAD metrics on the host (NumPy, float64): none of them is a sum over examples.

    accuracy, binary_f1, matthews_corrcoef       classification (GLUE: CoLA uses Matthews)
    pearson, spearman                            regression (STS-B)
    normalize_answer, exact_match, token_f1      SQuAD's official evaluation script, per answer
    squad_scores                                 EM / F1 (%) over examples, max over gold answers

SQuAD follows the official v1.1 / v2.0 evaluation: lower-case, drop punctuation, drop the
articles a / an / the, collapse whitespace; F1 over the multiset of answer tokens. A v2.0
question without an answer has the gold answer '' (EM = F1 = 1 only for the empty prediction).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def binary_f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
  """F1 of the positive class (GLUE's MRPC / QQP); 0 when there is no true positive."""
  predicted, actual = np.asarray(predictions) == positive, np.asarray(labels) == positive
  true_positives = float(np.sum(predicted & actual))
  if true_positives == 0:
    return 0.0
  precision = true_positives / np.sum(predicted)
  recall = true_positives / np.sum(actual)
  return float(2 * precision * recall / (precision + recall))


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
  """Multi-class Matthews correlation (Gorodkin's R_K); 0 when either side is constant."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  classes = np.union1d(predictions, labels)
  index_p, index_l = np.searchsorted(classes, predictions), np.searchsorted(classes, labels)
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (index_l, index_p), 1.0)
  n = confusion.sum()
  correct = np.trace(confusion)
  true_k, predicted_k = confusion.sum(axis=1), confusion.sum(axis=0)
  numerator = correct * n - true_k @ predicted_k
  denominator = np.sqrt((n**2 - predicted_k @ predicted_k) * (n**2 - true_k @ true_k))
  return float(numerator / denominator) if denominator > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  dx, dy = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
  return float(np.sum(dx * dy) / denominator) if denominator > 0 else 0.0


def _average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks, ties sharing their average rank."""
  order = np.argsort(x, kind='stable')
  sorted_x = x[order]
  ranks = np.empty(len(x), np.float64)
  start = 0
  while start < len(x):
    end = start + 1
    while end < len(x) and sorted_x[end] == sorted_x[start]:
      end += 1
    ranks[order[start:end]] = (start + end + 1) / 2.0  # mean of ranks start+1 .. end
    start = end
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation of the average ranks."""
  return pearson(
    _average_ranks(np.asarray(x, np.float64)), _average_ranks(np.asarray(y, np.float64))
  )


_ARTICLES = re.compile(r'\b(a|an|the)\b', re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
  text = ''.join(c for c in text.lower() if c not in _PUNCTUATION)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
  predicted_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(gold).split()
  if not predicted_tokens or not gold_tokens:  # no-answer: right only if both are empty
    return float(predicted_tokens == gold_tokens)
  common = collections.Counter(predicted_tokens) & collections.Counter(gold_tokens)
  overlap = sum(common.values())
  if overlap == 0:
    return 0.0
  precision = overlap / len(predicted_tokens)
  recall = overlap / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_scores(
  predictions: Sequence[str], gold_answers: Sequence[Sequence[str]]
) -> dict[str, float]:
  """{'exact_match', 'f1'} in percent: per example the best over its gold answers (a question
  without answers has the single gold answer ''). For v2.0 also 'has_answer_f1' and
  'no_answer_f1' when both kinds occur."""
  if len(predictions) != len(gold_answers):
    raise ValueError(f'{len(predictions)} predictions for {len(gold_answers)} questions')
  em, f1, has_answer = [], [], []
  for prediction, golds in zip(predictions, gold_answers):
    golds = [g for g in golds if normalize_answer(g)] or ['']
    em.append(max(exact_match(prediction, g) for g in golds))
    f1.append(max(token_f1(prediction, g) for g in golds))
    has_answer.append(golds != [''])
  em, f1, has_answer = np.asarray(em), np.asarray(f1), np.asarray(has_answer)
  scores = {'exact_match': 100.0 * float(em.mean()), 'f1': 100.0 * float(f1.mean())}
  if has_answer.any() and not has_answer.all():
    scores['has_answer_f1'] = 100.0 * float(f1[has_answer].mean())
    scores['no_answer_f1'] = 100.0 * float(f1[~has_answer].mean())
  return scores
