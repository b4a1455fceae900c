"""Classification loss and metric functions, and the softmax output layer."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import initializers

__all__ = ['Accuracy', 'ClipLogits', 'Hits', 'SoftmaxCrossEntropy',
           'SoftmaxLayer']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

# Forward cost per logit of tanh clipping (divide, tanh, multiply).
_CLIP_FLOPS = 6


def _CheckClip(logits_clip: float | None) -> None:
  if logits_clip is not None and not logits_clip > 0:
    raise base_layer.LayerConfigError(
        f'logits_clip must be None or > 0, got {logits_clip}.')


def _CheckLabels(logits: tf.Tensor, labels: tf.Tensor) -> None:
  if not labels.dtype.is_integer:
    raise base_layer.LayerInputError(
        f'labels must be integer class ids, got dtype {labels.dtype.name}.')
  if (logits.shape.rank is not None and labels.shape.rank is not None and
      not labels.shape.is_compatible_with(logits.shape[:-1])):
    raise base_layer.LayerInputError(
        f'labels of shape {labels.shape} do not match logits of shape '
        f'{logits.shape}: expected {logits.shape[:-1]}.')


def ClipLogits(logits: tf.Tensor, logits_clip: float | None) -> tf.Tensor:
  """Soft clip ``logits_clip * tanh(logits / logits_clip)``; None: unchanged.

  Near zero this is the identity; large logits saturate at +-logits_clip. The
  GPipe paper clips logits this way to stabilise deep Transformers. Being
  monotonic it never changes which class scores highest.
  """
  _CheckClip(logits_clip)
  if logits_clip is None:
    return logits
  clip = tf.cast(logits_clip, logits.dtype)
  return clip * tf.tanh(logits / clip)


def SoftmaxCrossEntropy(logits: tf.Tensor, labels: tf.Tensor,
                        label_smoothing: float = 0.0,
                        logits_clip: float | None = None) -> tf.Tensor:
  """Per-example softmax cross-entropy against integer labels, in float32.

  With smoothing s over C classes the target distribution is
  ``(1 - s) * one_hot(label) + s / C``.

  Args:
    logits: [..., C] of any float dtype (cast to float32).
    labels: [...] integer class ids in [0, C).
    label_smoothing: s in [0, 1).
    logits_clip: if set, logits go through ClipLogits first.

  Returns:
    float32 losses of shape [...], one per example (not reduced).

  Raises:
    base_layer.LayerConfigError: bad smoothing or clip.
    base_layer.LayerInputError: non-integer or mis-shaped labels.
  """
  if not 0.0 <= label_smoothing < 1.0:
    raise base_layer.LayerConfigError(
        f'label_smoothing must be in [0, 1), got {label_smoothing}.')
  logits = tf.convert_to_tensor(logits)
  labels = tf.convert_to_tensor(labels)
  _CheckLabels(logits, labels)
  logits = ClipLogits(tf.cast(logits, tf.float32), logits_clip)
  log_probs = tf.nn.log_softmax(logits, axis=-1)
  nll = -tf.gather(log_probs, labels, axis=-1, batch_dims=labels.shape.rank)
  if not label_smoothing:
    return nll
  # Cross-entropy with the uniform distribution: -mean_c log p_c.
  uniform = -tf.reduce_mean(log_probs, axis=-1)
  return (1.0 - label_smoothing) * nll + label_smoothing * uniform


def Hits(logits: tf.Tensor, labels: tf.Tensor, top_k: int = 1) -> tf.Tensor:
  """1.0 where the label is among the top_k logits, else 0.0 (labels' shape).

  Ties are broken towards the lower class id.
  """
  logits = tf.convert_to_tensor(logits)
  labels = tf.convert_to_tensor(labels)
  _CheckLabels(logits, labels)
  num_classes = logits.shape[-1]
  if top_k < 1 or (num_classes is not None and top_k > num_classes):
    raise base_layer.LayerConfigError(
        f'top_k must be in [1, {num_classes}], got {top_k}.')
  _, top = tf.math.top_k(tf.cast(logits, tf.float32), k=top_k)
  hit = tf.reduce_any(tf.equal(top, tf.cast(labels, tf.int32)[..., None]),
                      axis=-1)
  return tf.cast(hit, tf.float32)


def Accuracy(logits: tf.Tensor, labels: tf.Tensor, top_k: int = 1,
             weights: tf.Tensor | None = None) -> tf.Tensor:
  """Fraction of examples whose label is among the top_k logits (a scalar).

  Ties are broken towards the lower class id. `weights` (shape of labels, e.g.
  1 - paddings) makes it a weighted fraction; all-zero weights give 0.
  """
  hit = Hits(logits, labels, top_k)
  if weights is None:
    return tf.reduce_mean(hit)
  weights = tf.cast(weights, tf.float32)
  return tf.math.divide_no_nan(tf.reduce_sum(hit * weights),
                               tf.reduce_sum(weights))


class SoftmaxLayer(base_layer.BaseLayer):
  """Projects features to class logits; ``Loss`` turns logits into losses.

  Variables ``w`` [input_dim, num_classes] and ``b`` [num_classes].

  FProp returns the logits the loss sees: with ``logits_clip`` set they are
  already clipped (ClipLogits), and ``Loss`` does not clip again. FProp(x,
  *passthrough) returns any further inputs unchanged after the logits, so the
  layer can end a pipeline that carries (x, paddings).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the input features.')
    p.Define('num_classes', 0, 'Number of classes.')
    p.Define('logits_clip', None,
             'If set (> 0), logits are logits_clip * tanh(logits / '
             'logits_clip).')
    p.Define('label_smoothing', 0.0, 'Label smoothing of Loss, in [0, 1).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    owner = f"SoftmaxLayer '{self.path}'"
    if p.input_dim <= 0 or p.num_classes <= 0:
      raise base_layer.LayerConfigError(
          f'{owner} needs positive input_dim and num_classes, got '
          f'{p.input_dim} and {p.num_classes}.')
    try:
      _CheckClip(p.logits_clip)
    except base_layer.LayerConfigError as e:
      raise base_layer.LayerConfigError(f'{owner}: {e}') from None
    if not 0.0 <= p.label_smoothing < 1.0:
      raise base_layer.LayerConfigError(
          f'{owner}: label_smoothing must be in [0, 1), got '
          f'{p.label_smoothing}.')
    self.CreateVariable('w', [p.input_dim, p.num_classes])
    self.CreateVariable('b', [p.num_classes], init=initializers.Constant(0.0))

  def FProp(self, x: tf.Tensor, *passthrough: Any,
            training: bool = False) -> Any:
    """[..., input_dim] -> logits [..., num_classes] (then `passthrough`)."""
    self.CheckLastDim(x, self.p.input_dim)
    logits = tf.einsum('...d,dc->...c', x, self.w) + self.b
    logits = ClipLogits(logits, self.p.logits_clip)
    return (logits, *passthrough) if passthrough else logits

  def Loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Per-example float32 cross-entropy of FProp's logits, with smoothing."""
    return SoftmaxCrossEntropy(logits, labels,
                               label_smoothing=self.p.label_smoothing)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape,
                *passthrough_shapes: Shape) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, shape, p.input_dim)
    out = tuple(shape[:-1]) + (p.num_classes,)
    rows = base_layer.NumElements(shape[:-1])
    flops = rows * p.num_classes * (
        2 * p.input_dim + 1 + (_CLIP_FLOPS if p.logits_clip else 0))
    outs = (out,) + tuple(tuple(s) for s in passthrough_shapes)
    return LayerMeta(flops, outs, p.num_classes * (p.input_dim + 1))
