"""Token-sequence tasks (language modelling, translation) and synthetic token inputs for them.

Batches (int32 ids, float32 paddings with 1.0 at padded positions)::

  LanguageModelTask  {'ids': [B,T], 'labels': [B,T], 'paddings': [B,T]}
                     model(ids, paddings) -> logits [B,T,V] (or (logits, ...))
  TranslationTask    {'src_ids': [B,S], 'src_paddings': [B,S],
                      'tgt_ids': [B,T] (decoder input, BOS first),
                      'tgt_labels': [B,T], 'tgt_paddings': [B,T]}
                     model(src_ids, src_paddings, tgt_ids, tgt_paddings)
                       -> logits [B,T,V] (or (logits, ...))

Token ids 0, 1 and 2 are reserved for padding, BOS and EOS in the synthetic
inputs here and are the tasks' defaults.

The models are gpipe_tf.models.transformer's layer lists under a
PipeliningLayer or SequentialLayer; the loss is computed after the pipeline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.data import inputs
from gpipe_tf.tasks import base_task
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import loss as loss_lib

Metrics = base_task.Metrics
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_FIRST_TOKEN = 3  # Ids below this are reserved.


def _Logits(outputs: Any) -> tf.Tensor:
  """The logits: the model's output, or its first output."""
  return core.AsTuple(outputs)[0]


class _TokenTask(base_task.BaseTask):
  """Token-level cross-entropy and accuracy over unpadded positions."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('label_smoothing', 0.0, 'Label smoothing of the loss, in [0, 1).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    if not 0.0 <= self.p.label_smoothing < 1.0:
      raise ValueError(f"Task '{self.p.name}': label_smoothing must be in "
                       f'[0, 1), got {self.p.label_smoothing}.')

  def LossTerms(self, outputs, labels):
    """Per-token terms over unpadded positions (logits clipped by the model).

    The loss is the smoothed cross-entropy; metrics ``log_pplx`` (unsmoothed
    negative log-likelihood) and ``accuracy`` (top-1), all weighted by
    1 - paddings.
    """
    logits = _Logits(outputs)
    targets = tf.convert_to_tensor(labels[self.LABEL_KEYS[0]])
    weights = 1.0 - tf.cast(labels[self.LABEL_KEYS[1]], tf.float32)
    # One log-softmax serves the smoothed loss and the unsmoothed metric
    # (losses.SoftmaxCrossEntropy's formula; [B, T, V] is large).
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    nll = -tf.gather(log_probs, targets, axis=-1,
                     batch_dims=targets.shape.rank)
    loss = nll
    smoothing = self.p.label_smoothing
    if smoothing:
      uniform = -tf.reduce_mean(log_probs, axis=-1)
      loss = (1.0 - smoothing) * nll + smoothing * uniform
    return loss_lib.LossTerms(loss, weights, {
        'log_pplx': nll, 'accuracy': losses.Hits(logits, targets)})

  def BatchMetrics(self, batch):
    """``num_tokens``: unpadded tokens per example (the evaluator weighs
    metrics by batch size, so this averages right)."""
    weights = 1.0 - tf.cast(batch[self.LABEL_KEYS[1]], tf.float32)
    return {'num_tokens': tf.reduce_sum(weights) /
                          tf.cast(base_task.BatchSize(weights), tf.float32)}


class LanguageModelTask(_TokenTask):
  """Next-token prediction: ``labels[t]`` is the token after ``ids[t]``."""

  INPUT_KEYS = ('ids', 'paddings')
  LABEL_KEYS = ('labels', 'paddings')


class TranslationTask(_TokenTask):
  """Translation with teacher forcing, and greedy decoding (``Decode``)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.label_smoothing = 0.1
    p.Define('bos_id', BOS_ID, 'First decoder input of Decode.')
    p.Define('eos_id', EOS_ID, 'End of sentence: Decode stops a row here.')
    p.Define('pad_id', PAD_ID, 'Decode fills a row with this after its EOS.')
    return p

  INPUT_KEYS = ('src_ids', 'src_paddings', 'tgt_ids', 'tgt_paddings')
  LABEL_KEYS = ('tgt_labels', 'tgt_paddings')

  def _RunModel(self, *xs: tf.Tensor) -> tf.Tensor:
    layers = getattr(self.model, 'layers', None)
    if isinstance(layers, list) and layers:
      return _Logits(core.RunSequence(layers, xs, training=False))
    return _Logits(self.model.FProp(*xs, training=False))

  def Decode(self, batch: dict[str, tf.Tensor], max_len: int) -> tf.Tensor:
    """Greedy translations of ``batch['src_ids']``: int32 ids [B, max_len].

    Row b holds the argmax tokens y_1, y_2, ... up to and including its first
    EOS, then ``pad_id``. Step t reruns the whole model on a [B, max_len]
    decoder-input buffer (BOS, y_1, .., y_t, then padding) and reads position
    t; causal self-attention makes the unfilled positions irrelevant. There is
    no key cache, so decoding costs max_len full forward passes.

    The model's layers run one after another (``core.RunSequence`` over
    ``model.layers``), outside the pipeline schedule: decoding is sequential
    in the target position anyway, and any batch size works (no split into
    micro-batches). Each layer's variables stay on their cell's device.
    """
    if max_len < 1:
      raise ValueError(f'max_len must be >= 1, got {max_len}.')
    src_ids = tf.convert_to_tensor(batch['src_ids'])
    src_paddings = tf.convert_to_tensor(batch['src_paddings'])
    dtype = src_ids.dtype
    b = tf.shape(src_ids)[0]
    position = tf.range(max_len)[None, :]
    tgt = tf.where(position == 0, tf.cast(self.p.bos_id, dtype),
                   tf.cast(self.p.pad_id, dtype)) + tf.zeros([b, 1], dtype)
    tgt_paddings = tf.zeros([b, max_len], src_paddings.dtype)
    out = tf.fill([b, max_len], tf.cast(self.p.pad_id, tf.int32))
    done = tf.zeros([b], tf.bool)

    def _Step(t, tgt, out, done):
      logits = self._RunModel(src_ids, src_paddings, tgt, tgt_paddings)
      best = tf.argmax(logits[:, t], axis=-1, output_type=tf.int32)
      best = tf.where(done, tf.cast(self.p.pad_id, tf.int32), best)
      out = tf.where(position == t, best[:, None], out)
      tgt = tf.where(position == t + 1, tf.cast(best, dtype)[:, None], tgt)
      return t + 1, tgt, out, tf.logical_or(done, best == self.p.eos_id)

    def _NotDone(t, tgt, out, done):
      del tgt, out
      return tf.logical_and(t < max_len,
                            tf.logical_not(tf.reduce_all(done)))

    _, _, out, _ = tf.while_loop(_NotDone, _Step,
                                 (tf.constant(0), tgt, out, done))
    return out


class SyntheticTokenInput(inputs.BaseInputGenerator):
  """Language-model batches of noisy arithmetic sequences over a vocabulary.

  Sequence i starts at a random token and steps by a random stride (1..4)
  modulo the non-reserved ids, so the next token follows from the previous
  two; a fraction ``noise`` of tokens is replaced by random ones. Lengths are
  uniform in [min_length, seq_len] (min_length 0: always seq_len) and the rest
  is padding. Features: ids, labels (ids shifted by one), paddings.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size V (ids 0..2 reserved).')
    p.Define('seq_len', 1024, 'Length T of every example.')
    p.Define('min_length', 0, 'Shortest unpadded length; 0 means seq_len.')
    p.Define('num_examples', 256, 'Examples N in one epoch.')
    p.Define('noise', 0.0, 'Fraction of tokens replaced by random ones.')
    p.Define('data_seed', 0, 'Seed of the generated examples.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self.p
    if p.vocab_size <= _FIRST_TOKEN or p.seq_len < 1 or p.num_examples < 1:
      raise inputs.InputConfigError(
          f'{p.name}: needs vocab_size > {_FIRST_TOKEN} and positive seq_len '
          f'and num_examples, got {p.vocab_size}, {p.seq_len} and '
          f'{p.num_examples}.')
    if not 0 <= p.min_length <= p.seq_len:
      raise inputs.InputConfigError(
          f'{p.name}: min_length must be in [0, seq_len={p.seq_len}], got '
          f'{p.min_length}.')

  def _LoadExamples(self) -> dict[str, Any]:
    p = self.p
    rng = np.random.default_rng(p.data_seed)
    n, t = p.num_examples, p.seq_len
    span = p.vocab_size - _FIRST_TOKEN
    start = rng.integers(0, span, size=[n, 1])
    stride = rng.integers(1, 5, size=[n, 1])
    tokens = (start + stride * np.arange(t + 1)[None, :]) % span
    noisy = rng.random([n, t + 1]) < p.noise
    tokens = np.where(noisy, rng.integers(0, span, size=[n, t + 1]), tokens)
    tokens = (tokens + _FIRST_TOKEN).astype(np.int32)
    lengths = rng.integers(p.min_length or t, t + 1, size=[n, 1])
    paddings = (np.arange(t)[None, :] >= lengths).astype(np.float32)
    keep = paddings == 0
    return {'ids': np.where(keep, tokens[:, :-1], PAD_ID).astype(np.int32),
            'labels': np.where(keep, tokens[:, 1:], PAD_ID).astype(np.int32),
            'paddings': paddings}


class SyntheticTranslationInput(inputs.BaseInputGenerator):
  """Translation batches whose target is the source sentence reversed.

  A source of n random tokens (n uniform in [min_length, src_len - 1]) is
  followed by EOS; the decoder input is BOS then the reversed tokens, the
  labels the reversed tokens then EOS. Features: src_ids, src_paddings,
  tgt_ids, tgt_labels, tgt_paddings.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 64000, 'Shared vocabulary size (ids 0..2 reserved).')
    p.Define('src_len', 128, 'Length S of the source (with its EOS).')
    p.Define('tgt_len', 128, 'Length T of the target; >= src_len.')
    p.Define('min_length', 1, 'Fewest source tokens before EOS.')
    p.Define('num_examples', 256, 'Sentence pairs N in one epoch.')
    p.Define('data_seed', 0, 'Seed of the generated examples.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self.p
    if p.vocab_size <= _FIRST_TOKEN or p.num_examples < 1:
      raise inputs.InputConfigError(
          f'{p.name}: needs vocab_size > {_FIRST_TOKEN} and num_examples >= 1,'
          f' got {p.vocab_size} and {p.num_examples}.')
    if not 1 <= p.min_length < p.src_len <= p.tgt_len:
      raise inputs.InputConfigError(
          f'{p.name}: needs 1 <= min_length < src_len <= tgt_len, got '
          f'{p.min_length}, {p.src_len} and {p.tgt_len}.')

  def _LoadExamples(self) -> dict[str, Any]:
    p = self.p
    rng = np.random.default_rng(p.data_seed)
    n = p.num_examples
    lengths = rng.integers(p.min_length, p.src_len, size=[n, 1])
    tokens = rng.integers(_FIRST_TOKEN, p.vocab_size, size=[n, p.src_len - 1])
    pos_s = np.arange(p.src_len)[None, :]
    src = np.where(pos_s < lengths,
                   np.pad(tokens, [[0, 0], [0, 1]]), PAD_ID)
    src = np.where(pos_s == lengths, EOS_ID, src)
    # Reversed tokens: position j holds token lengths - 1 - j.
    pos_t = np.arange(p.tgt_len)[None, :]
    index = np.clip(lengths - 1 - pos_t, 0, p.src_len - 2)
    reversed_tokens = np.take_along_axis(tokens, index, axis=1)
    labels = np.where(pos_t < lengths, reversed_tokens, PAD_ID)
    labels = np.where(pos_t == lengths, EOS_ID, labels)
    tgt = np.concatenate([np.full([n, 1], BOS_ID), labels[:, :-1]], axis=1)
    tgt = np.where(pos_t <= lengths, tgt, PAD_ID)
    return {'src_ids': src.astype(np.int32),
            'src_paddings': (pos_s > lengths).astype(np.float32),
            'tgt_ids': tgt.astype(np.int32),
            'tgt_labels': labels.astype(np.int32),
            'tgt_paddings': (pos_t > lengths).astype(np.float32)}
