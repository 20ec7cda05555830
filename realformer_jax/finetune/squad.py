"""SQuAD v1.1 / v2.0: question + context -> answer span, over sliding windows of the context.

Features (BERT's run_squad, on character offsets from `tokenizer.encode_with_offsets`):

    [CLS] question [SEP] context window [SEP]    segment 0 up to the first [SEP], 1 after it

A context longer than fits is cut into windows that start `doc_stride` tokens apart, so every
context token is in at least one window; a token's answer score is read from the window where it
has the most context on both sides (`max_context`). A training window's target is the answer's
first and last token, or [CLS] (position 0) when the window does not hold the whole answer or
the question has none (v2.0).

Prediction per question: over its windows, the best-scoring span (start logit + end logit) among
the n-best starts and ends, inside the context, end >= start, at most `max_answer_len` tokens,
starting where the window has the most context; v2.0 answers '' when the no-answer score
([CLS] start + [CLS] end, the lowest over windows) beats it. Answers are cut from the original
context by character offsets and scored with the official normalisation (metrics.py).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from realformer_jax.data import Tokenizer
from realformer_jax.finetune import metrics as metrics_lib

FEATURE_KEYS = ('input_ids', 'segment_ids', 'input_mask', 'start_positions', 'end_positions')


@dataclasses.dataclass(frozen=True)
class Examples:
  questions: list[str]
  contexts: list[str]
  gold_answers: list[list[str]]  # [] = no answer (v2.0)
  answer_starts: list[int]  # character offset of the first gold answer; -1 if none


@dataclasses.dataclass(frozen=True)
class Features:
  arrays: dict[str, np.ndarray]  # FEATURE_KEYS: [F, L] inputs, [F] target token positions
  example_index: np.ndarray  # [F] the question each window belongs to
  token_starts: np.ndarray  # [F, L] character offset in the context; -1 outside it
  token_ends: np.ndarray  # [F, L] exclusive end offset; -1 outside the context
  max_context: np.ndarray  # [F, L] bool: this window gives the token its widest context


def examples_from_records(records: Sequence[dict]) -> Examples:
  """TFDS squad records (v1.1 or v2.0) -> Examples."""

  def text(value):
    return value.decode('utf-8') if isinstance(value, bytes) else str(value)

  questions, contexts, golds, starts = [], [], [], []
  for record in records:
    answers = [text(t) for t in np.asarray(record['answers']['text']).reshape(-1)]
    offsets = np.asarray(record['answers']['answer_start']).reshape(-1)
    if bool(record.get('is_impossible', False)):
      answers = []
    questions.append(text(record['question']))
    contexts.append(text(record['context']))
    golds.append(answers)
    starts.append(int(offsets[0]) if answers and len(offsets) else -1)
  return Examples(questions, contexts, golds, starts)


def _windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of windows over `num_tokens` tokens, `stride` apart, covering all."""
  spans, start = [], 0
  while True:
    length = min(num_tokens - start, window)
    spans.append((start, length))
    if start + length >= num_tokens:
      return spans
    start += min(length, stride)


def _max_context(spans: list[tuple[int, int]], span_index: int, position: int) -> bool:
  """Whether window `span_index` gives the token at `position` its best score: min(tokens to
  the left, tokens to the right) + 0.01 * window length (BERT's _check_is_max_context)."""
  best_score, best_index = None, None
  for index, (start, length) in enumerate(spans):
    end = start + length - 1
    if not start <= position <= end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return best_index == span_index


def _answer_tokens(
  starts: np.ndarray, ends: np.ndarray, char_start: int, char_end: int
) -> tuple[int, int]:
  """First and last context token overlapping [char_start, char_end), or (-1, -1)."""
  overlapping = np.flatnonzero((ends > char_start) & (starts < char_end))
  if len(overlapping) == 0:
    return -1, -1
  return int(overlapping[0]), int(overlapping[-1])


def make_features(
  examples: Examples, tokenizer: Tokenizer, max_len: int, doc_stride: int, max_query_len: int
) -> Features:
  """Every window of every question, with targets for training (see the module docstring)."""
  rows = {k: [] for k in FEATURE_KEYS}
  example_index, token_starts, token_ends, max_context = [], [], [], []
  question_ids = tokenizer.encode_batch(examples.questions)
  for index, (question, context) in enumerate(zip(question_ids, examples.contexts)):
    question = question[:max_query_len]
    ids, starts, ends = tokenizer.encode_with_offsets(context)
    window = max_len - len(question) - 3
    if window < 1:
      raise ValueError(
        f'max_len={max_len} leaves no room for the context after a '
        f'{len(question)}-token question (max_query_len={max_query_len})'
      )
    target = (-1, -1)
    answer = examples.gold_answers[index]
    char_start = examples.answer_starts[index]
    if answer and 0 <= char_start < len(context):
      target = _answer_tokens(starts, ends, char_start, char_start + len(answer[0]))
    spans = _windows(max(len(ids), 1), window, doc_stride)
    for span_index, (start, length) in enumerate(spans):
      offset = len(question) + 2  # [CLS] question [SEP]
      input_ids = np.zeros(max_len, np.int32)
      sequence = np.concatenate(
        [
          [tokenizer.cls_id],
          question,
          [tokenizer.sep_id],
          ids[start : start + length],
          [tokenizer.sep_id],
        ]
      )
      input_ids[: len(sequence)] = sequence
      segment_ids = np.zeros(max_len, np.int32)
      segment_ids[offset : len(sequence)] = 1
      input_mask = (np.arange(max_len) < len(sequence)).astype(np.int32)
      tok_start, tok_end = np.full(max_len, -1, np.int32), np.full(max_len, -1, np.int32)
      tok_start[offset : offset + length] = starts[start : start + length]
      tok_end[offset : offset + length] = ends[start : start + length]
      is_max = np.zeros(max_len, bool)
      for i in range(length):
        is_max[offset + i] = _max_context(spans, span_index, start + i)
      inside = start <= target[0] and target[1] < start + length and target[0] >= 0
      rows['input_ids'].append(input_ids)
      rows['segment_ids'].append(segment_ids)
      rows['input_mask'].append(input_mask)
      rows['start_positions'].append(target[0] - start + offset if inside else 0)
      rows['end_positions'].append(target[1] - start + offset if inside else 0)
      example_index.append(index)
      token_starts.append(tok_start)
      token_ends.append(tok_end)
      max_context.append(is_max)
  arrays = {k: np.asarray(v, np.int32) for k, v in rows.items()}
  return Features(
    arrays,
    np.asarray(example_index, np.int32),
    np.asarray(token_starts),
    np.asarray(token_ends),
    np.asarray(max_context),
  )


def predict(
  examples: Examples,
  features: Features,
  start_logits: np.ndarray,
  end_logits: np.ndarray,
  *,
  version_2: bool,
  max_answer_len: int = 30,
  n_best: int = 20,
  null_threshold: float = 0.0,
) -> list[str]:
  """The answer text of every question from its windows' logits ([F, L] each, rows in
  `features` order)."""
  answers = []
  windows_of = [[] for _ in examples.questions]
  for feature, example in enumerate(features.example_index):
    windows_of[example].append(feature)
  for example, windows in enumerate(windows_of):
    best_score, best_text = -np.inf, ''
    null_score = np.inf
    for f in windows:
      starts, ends = start_logits[f], end_logits[f]
      null_score = min(null_score, float(starts[0] + ends[0]))
      top_starts = np.argsort(-starts)[:n_best]
      top_ends = np.argsort(-ends)[:n_best]
      for s in top_starts:
        if features.token_starts[f, s] < 0 or not features.max_context[f, s]:
          continue
        for e in top_ends:
          if features.token_starts[f, e] < 0 or e < s or e - s + 1 > max_answer_len:
            continue
          score = float(starts[s] + ends[e])
          if score > best_score:
            best_score = score
            best_text = examples.contexts[example][
              features.token_starts[f, s] : features.token_ends[f, e]
            ]
    if version_2 and null_score - best_score > null_threshold:
      best_text = ''
    answers.append(best_text)
  return answers


def score(examples: Examples, predictions: list[str]) -> dict[str, float]:
  return metrics_lib.squad_scores(predictions, examples.gold_answers)
