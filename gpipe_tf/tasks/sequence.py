"""Token-sequence tasks: language modelling and translation (with greedy decoding).

Batches (int32 ids, float32 paddings with 1.0 at padded positions)::

  LanguageModelTask  {'ids': [B,T], 'labels': [B,T], 'paddings': [B,T]}
                     model(ids, paddings) -> logits [B,T,V] (or (logits, ...))
  TranslationTask    {'src_ids': [B,S], 'src_paddings': [B,S],
                      'tgt_ids': [B,T] (decoder input, BOS first),
                      'tgt_labels': [B,T], 'tgt_paddings': [B,T]}
                     model(src_ids, src_paddings, tgt_ids, tgt_paddings)
                       -> logits [B,T,V] (or (logits, ...))

Token ids 0, 1 and 2 are padding, BOS and EOS (gpipe_tf.data.vocab) and are
the tasks' defaults; gpipe_tf.data.synthetic_text generates such batches.

The models are gpipe_tf.models.transformer's layer lists under a
PipeliningLayer or SequentialLayer; the loss is computed after the pipeline.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.data import vocab as vocab_lib
from gpipe_tf.layers import base_layer
from gpipe_tf.tasks import base_task
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import loss as loss_lib

__all__ = ['LanguageModelTask', 'TranslationTask']

Metrics = base_task.Metrics
PAD_ID, BOS_ID, EOS_ID = vocab_lib.PAD_ID, vocab_lib.BOS_ID, vocab_lib.EOS_ID


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
      raise base_layer.LayerConfigError(
          f"Task '{self.p.name}': label_smoothing must be in [0, 1), got "
          f'{self.p.label_smoothing}.')

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
