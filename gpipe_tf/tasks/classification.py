"""ClassificationTask: softmax cross-entropy of a network's logits against integer labels."""

from __future__ import annotations

from gpipe_tf.layers import losses
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.tasks import base_task

__all__ = ['ClassificationTask']


class ClassificationTask(base_task.BaseTask):
  """Softmax classification of ``batch['inputs']`` into ``batch['labels']``.

  The model maps inputs to logits [B, C]. Loss: mean softmax cross-entropy
  (with optional label smoothing and logit clipping). Metrics: ``loss``,
  ``accuracy`` (top-1) and, when C >= 5, ``top5_accuracy``.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('label_smoothing', 0.0, 'Label smoothing in [0, 1).')
    p.Define('logits_clip', None,
             'If set, logits are soft-clipped to +-this before the loss.')
    return p

  INPUT_KEYS = ('inputs',)
  LABEL_KEYS = ('labels',)

  def LossTerms(self, outputs, labels):
    logits, labels = outputs, labels['labels']
    per_example = losses.SoftmaxCrossEntropy(
        logits, labels, label_smoothing=self.p.label_smoothing,
        logits_clip=self.p.logits_clip)
    metrics = {'accuracy': losses.Hits(logits, labels)}
    num_classes = logits.shape[-1]
    if num_classes is not None and num_classes >= 5:
      metrics['top5_accuracy'] = losses.Hits(logits, labels, top_k=5)
    return loss_lib.LossTerms(per_example, None, metrics)
