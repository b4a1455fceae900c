"""Translation metrics: corpus BLEU (sacrebleu), token and sequence accuracy, BLEU of a decoded test set.

BLEU is sacrebleu's corpus BLEU on detokenised text (default tokenizer
'13a', exponential smoothing), so numbers compare with published sacreBLEU
scores. Token accuracies reuse ``gpipe_tf.layers.losses.Accuracy`` (top-k,
weighted) with weights 1 - paddings.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import numpy as np
import sacrebleu
import tensorflow as tf

from gpipe_tf.data import vocab as vocab_lib
from gpipe_tf.layers import losses

__all__ = ['BleuResult', 'CorpusBleu', 'DecodeBleu', 'SequenceAccuracy',
           'TokenAccuracy']


def CorpusBleu(hypotheses: Sequence[str], references: Sequence[str],
               tokenize: str = '13a') -> float:
  """Corpus BLEU in [0, 100] of `hypotheses` against one reference each.

  Raises:
    ValueError: the lists differ in length or are empty.
  """
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} '
                     'references; BLEU needs one reference per hypothesis.')
  if not hypotheses:
    raise ValueError('BLEU of an empty corpus is undefined.')
  return float(sacrebleu.corpus_bleu(hypotheses, [references],
                                     tokenize=tokenize).score)


def TokenAccuracy(logits: tf.Tensor, labels: tf.Tensor, paddings: tf.Tensor,
                  top_k: int = 1) -> tf.Tensor:
  """Fraction of unpadded positions whose label is in the top_k logits.

  Args:
    logits: [B, T, V]. labels: [B, T] int. paddings: [B, T], 1.0 = padded.
  """
  return losses.Accuracy(logits, labels, top_k=top_k,
                         weights=1.0 - tf.cast(paddings, tf.float32))


def SequenceAccuracy(predictions: tf.Tensor, labels: tf.Tensor,
                     paddings: tf.Tensor) -> tf.Tensor:
  """Fraction of sequences predicted right at every unpadded position.

  Args:
    predictions, labels: [B, T] int ids. paddings: [B, T], 1.0 = padded.
  """
  wrong = tf.logical_and(
      tf.not_equal(tf.cast(predictions, tf.int64), tf.cast(labels, tf.int64)),
      tf.cast(paddings, tf.float32) < 0.5)
  return tf.reduce_mean(tf.cast(~tf.reduce_any(wrong, axis=1), tf.float32))


@dataclasses.dataclass
class BleuResult:
  """What DecodeBleu measured."""
  bleu: float
  exact_match: float  # Fraction of hypotheses equal to their reference.
  hypotheses: list[str]
  references: list[str]


def DecodeBleu(decode_fn: Callable[[dict], tf.Tensor],
               batches: Iterable[dict], vocab: vocab_lib.Vocabulary,
               max_batches: int = 0) -> BleuResult:
  """Decodes every batch and scores the texts with corpus BLEU.

  Args:
    decode_fn: batch (ParallelTextInput features) -> int ids [B, T]; ids
      after the first EOS are ignored (e.g. a task's greedy Decode).
    batches: the evaluation batches (e.g. ParallelTextInput(...).GetDataset()
      with repeat False).
    vocab: turns hypothesis ids and the batches' tgt_labels into text. The
      references are the decoded labels: the reference text as the
      vocabulary normalises it (identical for plain text), truncated if the
      input truncated it.
    max_batches: stop after this many batches; 0 = all.

  Raises:
    ValueError: no batch at all.
  """
  hypotheses, references = [], []
  for i, batch in enumerate(batches):
    if 0 < max_batches <= i:
      break
    ids = np.asarray(decode_fn(batch))
    hypotheses += [vocab.Decode(row) for row in ids]
    references += [vocab.Decode(row) for row in batch['tgt_labels'].numpy()]
  if not hypotheses:
    raise ValueError('DecodeBleu got no batch to decode.')
  exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
  return BleuResult(CorpusBleu(hypotheses, references), exact, hypotheses,
                    references)
