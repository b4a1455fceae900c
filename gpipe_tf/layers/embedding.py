"""Token embedding lookup, with the transposed table as a tied softmax."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import initializers

__all__ = ['EmbeddingLayer']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape


class EmbeddingLayer(base_layer.BaseLayer):
  """Looks up integer ids in a [vocab_size, embedding_dim] table ``emb``.

  ``params_init`` defaults to Gaussian(1.0) here. The Transformer recipe for a
  table shared with the softmax (``EmitLogits``) is
  ``params_init=Gaussian(1 / sqrt(embedding_dim))`` with
  ``scale_sqrt_depth=True``: lookups come out with unit scale while the tied
  logits stay small.

  FProp(ids, *passthrough) returns the embeddings followed by any further
  inputs unchanged, so a pipeline can carry (ids, paddings) into
  (embeddings, paddings).

  Ids outside [0, vocab_size) are an error on CPU (tf.gather) and give zeros
  on accelerators; this layer deliberately does NOT check them at run time.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.params_init = initializers.Gaussian(1.0)
    p.Define('vocab_size', 0, 'Number of rows of the table.')
    p.Define('embedding_dim', 0, 'Size of each embedding.')
    p.Define('scale_sqrt_depth', False,
             'If True, multiply looked-up embeddings by sqrt(embedding_dim).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    if p.vocab_size <= 0 or p.embedding_dim <= 0:
      raise base_layer.LayerConfigError(
          f"EmbeddingLayer '{self.path}' needs positive "
          f'vocab_size and embedding_dim, got {p.vocab_size} and '
          f'{p.embedding_dim}.')
    self.CreateVariable('emb', [p.vocab_size, p.embedding_dim])

  def FProp(self, ids: tf.Tensor, *passthrough: Any,
            training: bool = False) -> Any:
    """Integer ids [...] -> [..., embedding_dim] (then `passthrough`)."""
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (EmbeddingLayer) expects integer ids but got "
          f'dtype {ids.dtype.name} with shape {ids.shape}')
    y = tf.gather(self.emb, ids)
    if self.p.scale_sqrt_depth:
      y *= tf.cast(math.sqrt(self.p.embedding_dim), y.dtype)
    return (y, *passthrough) if passthrough else y

  def EmitLogits(self, x: tf.Tensor) -> tf.Tensor:
    """Tied softmax: x [..., embedding_dim] @ emb^T -> [..., vocab_size]."""
    self.CheckLastDim(x, self.p.embedding_dim)
    return tf.einsum('...d,vd->...v', x, self.emb)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, ids_shape: Shape,
                *passthrough_shapes: Shape) -> LayerMeta:
    out = tuple(ids_shape) + (p.embedding_dim,)
    flops = base_layer.NumElements(out) if p.scale_sqrt_depth else 0
    outs = (out,) + tuple(tuple(s) for s in passthrough_shapes)
    return LayerMeta(flops, outs, p.vocab_size * p.embedding_dim)
