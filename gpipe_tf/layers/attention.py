"""Multi-head dot-product attention with padding and causal masks."""

from __future__ import annotations

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core

__all__ = ['MultiHeadAttention']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

# Added to the logits of masked positions (softmax runs in float32).
_MASK_LOGIT = -1e9
# Per-element cost of max-subtract, exp, sum and divide in the softmax.
_SOFTMAX_FLOPS = 5


def _InheritBaseParams(parent: hyperparams.Params,
                      child: hyperparams.InstantiableParams
                      ) -> hyperparams.InstantiableParams:
  """Gives `child` the parent's dtype, params_init and random_seed."""
  return child.Set(dtype=parent.dtype, params_init=parent.params_init.Copy(),
                   random_seed=parent.random_seed)


def _DropoutMeta(keep_prob: float, shape: Shape) -> LayerMeta:
  """FPropMeta of a DropoutLayer that costs nothing when it keeps everything."""
  if keep_prob >= 1.0:
    return LayerMeta(0, (tuple(shape),), 0)
  return core.DropoutLayer.FPropMeta(
      core.DropoutLayer.Params().Set(keep_prob=keep_prob), shape)


class MultiHeadAttention(base_layer.BaseLayer):
  """Multi-head attention: softmax(Q K^T / sqrt(d) + mask) V, then a projection.

  Layout (B batch, T queries, S keys, N heads, H = hidden_dim / N)::

    query [B,T,D] --query--> [B,T,N,H] \\
                                         logits [B,N,T,S] -> softmax -> dropout
    key_value [B,S,D] -key--> [B,S,N,H] /                                 |
    key_value ------value--> [B,S,N,H] ---------------------------> [B,T,N,H]
                                                   --post--> [B,T,D]

  Children ``query``, ``key``, ``value`` (D -> hidden_dim) and ``post``
  (hidden_dim -> D) are FCLayers with no activation; ``atten_dropout`` drops
  attention probabilities in training. Logits are scaled by 1/sqrt(H) and the
  softmax runs in float32 whatever the dtype.

  Masks: ``paddings`` [B, S] (1.0 = padded) hides padded keys; ``causal``
  hides key s from query t when s > t (positions counted from the start of
  both sequences). A query whose keys are all hidden attends uniformly to all
  of them rather than producing NaN; its output is meaningless, as is any
  output at a padded query position.

  This layer deliberately does NOT cache keys for step-by-step decoding, add
  position encodings, or carry paddings through as an output.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size D of the query and key_value features.')
    p.Define('hidden_dim', 0,
             'Total size of the projected heads; 0 means input_dim.')
    p.Define('num_heads', 1, 'Number of heads; must divide hidden_dim.')
    p.Define('atten_dropout_prob', 0.0,
             'Dropout probability on attention probabilities (training).')
    p.Define('use_bias', True, 'Whether the four projections have biases.')
    return p

  @classmethod
  def _Hidden(cls, p: hyperparams.Params) -> int:
    return p.hidden_dim or p.input_dim

  @classmethod
  def _Validate(cls, p: hyperparams.Params, owner: str) -> None:
    if p.input_dim <= 0 or p.hidden_dim < 0 or p.num_heads <= 0:
      raise base_layer.LayerConfigError(
          f'{owner} needs positive input_dim and num_heads and '
          f'hidden_dim >= 0, got {p.input_dim}, {p.num_heads} and '
          f'{p.hidden_dim}.')
    if cls._Hidden(p) % p.num_heads:
      raise base_layer.LayerConfigError(
          f'{owner}: num_heads {p.num_heads} must divide '
          f'hidden_dim {cls._Hidden(p)}.')
    if not 0.0 <= p.atten_dropout_prob < 1.0:
      raise base_layer.LayerConfigError(
          f'{owner}: atten_dropout_prob must be in [0, 1), got '
                       f'{p.atten_dropout_prob}.')

  @classmethod
  def _ChildrenParams(cls, p: hyperparams.Params) -> dict:
    hidden = cls._Hidden(p)

    def Fc(input_dim, output_dim):
      return _InheritBaseParams(p, core.FCLayer.Params().Set(
          input_dim=input_dim, output_dim=output_dim, activation='NONE',
          has_bias=p.use_bias))

    children = {
        'query': Fc(p.input_dim, hidden),
        'key': Fc(p.input_dim, hidden),
        'value': Fc(p.input_dim, hidden),
        'post': Fc(hidden, p.input_dim),
        'atten_dropout': _InheritBaseParams(p, core.DropoutLayer.Params().Set(
            keep_prob=1.0 - p.atten_dropout_prob)),
    }
    for name, child in children.items():
      child.name = name  # As CreateChild names them; used in error messages.
    return children

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    self._Validate(self.p, f"MultiHeadAttention '{self.path}'")
    for name, child in self._ChildrenParams(self.p).items():
      self.CreateChild(name, child)
    self._dim_per_head = self._Hidden(self.p) // self.p.num_heads

  def _CheckSequence(self, x: tf.Tensor, what: str) -> None:
    if x.shape.rank != 3:
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (MultiHeadAttention) expects {what} of shape "
          f'[batch, time, {self.p.input_dim}] but got {x.shape}')
    self.CheckLastDim(x, self.p.input_dim, what)

  def _SplitHeads(self, x: tf.Tensor) -> tf.Tensor:
    """[B, T, N*H] -> [B, T, N, H]."""
    dims = [d if d is not None else tf.shape(x)[i]
            for i, d in enumerate(x.shape.as_list()[:2])]
    return tf.reshape(x, dims + [self.p.num_heads, self._dim_per_head])

  def _MergeHeads(self, x: tf.Tensor) -> tf.Tensor:
    """[B, T, N, H] -> [B, T, N*H]."""
    dims = [d if d is not None else tf.shape(x)[i]
            for i, d in enumerate(x.shape.as_list()[:2])]
    return tf.reshape(x, dims + [self._Hidden(self.p)])

  def _Mask(self, logits: tf.Tensor, paddings: tf.Tensor | None,
            causal: bool) -> tf.Tensor:
    """Sets masked entries of logits [B, N, T, S] to a large negative value."""
    hidden = None
    if paddings is not None:
      hidden = tf.cast(paddings, tf.float32)[:, None, None, :] > 0.5
    if causal:
      shape = tf.shape(logits)
      future = (tf.range(shape[3])[None, :] > tf.range(shape[2])[:, None])
      hidden = future if hidden is None else tf.logical_or(hidden, future)
    if hidden is None:
      return logits
    return tf.where(hidden, tf.constant(_MASK_LOGIT, logits.dtype), logits)

  def FProp(self, query: tf.Tensor, key_value: tf.Tensor | None = None,
            paddings: tf.Tensor | None = None, *, causal: bool = False,
            training: bool = False) -> tf.Tensor:
    """Attends from `query` to `key_value` (to `query` itself when None).

    Args:
      query: [B, T, input_dim].
      key_value: [B, S, input_dim], or None for self-attention (S = T).
      paddings: [B, S] float, 1.0 marks a padded key; None: no padding.
      causal: if True, query t only sees keys s <= t.
      training: enables attention dropout.

    Returns:
      [B, T, input_dim].

    Raises:
      LayerInputError: an input has the wrong rank or last dimension.
    """
    query = tf.convert_to_tensor(query)
    self._CheckSequence(query, 'query')
    if key_value is None:
      key_value = query
    else:
      key_value = tf.convert_to_tensor(key_value)
      self._CheckSequence(key_value, 'key_value')
    if paddings is not None:
      paddings = tf.convert_to_tensor(paddings)
    if paddings is not None and paddings.shape.rank != 2:
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (MultiHeadAttention) expects paddings of "
          f'shape [batch, key_time] but got {paddings.shape}')
    q = self._SplitHeads(self.query.FProp(query))
    k = self._SplitHeads(self.key.FProp(key_value))
    v = self._SplitHeads(self.value.FProp(key_value))
    q *= tf.cast(self._dim_per_head ** -0.5, q.dtype)
    logits = tf.cast(tf.einsum('btnh,bsnh->bnts', q, k), tf.float32)
    logits = self._Mask(logits, paddings, causal)
    probs = tf.cast(tf.nn.softmax(logits, axis=-1), v.dtype)
    probs = self.atten_dropout.FProp(probs, training=training)
    context = self._MergeHeads(tf.einsum('bnts,bsnh->btnh', probs, v))
    return self.post.FProp(context)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, query_shape: Shape,
                key_shape: Shape | None = None,
                paddings_shape: Shape | None = None) -> LayerMeta:
    """Cost of FProp; key_shape None means self-attention."""
    del paddings_shape  # Masking cost is negligible.
    cls._Validate(p, f"MultiHeadAttention '{p.name}'")
    for what, shape in (('query', query_shape), ('key_value', key_shape)):
      if shape is not None and len(shape) != 3:
        raise base_layer.LayerInputError(
            f"layer '{p.name}' (MultiHeadAttention) expects {what} of shape "
            f'[batch, time, {p.input_dim}] but got {list(shape)}')
    key_shape = query_shape if key_shape is None else key_shape
    children = cls._ChildrenParams(p)
    hidden = cls._Hidden(p)
    batch, t = query_shape[0], query_shape[1]
    s = key_shape[1]
    probs_shape = (batch, p.num_heads, t, s)
    metas = [
        children['query'].cls.FPropMeta(children['query'], query_shape),
        children['key'].cls.FPropMeta(children['key'], key_shape),
        children['value'].cls.FPropMeta(children['value'], key_shape),
        children['post'].cls.FPropMeta(children['post'],
                                       (batch, t, hidden)),
        _DropoutMeta(1.0 - p.atten_dropout_prob, probs_shape),
    ]
    num_probs = base_layer.NumElements(probs_shape)
    # Scaling q, the two attention matmuls, and the softmax.
    flops = (base_layer.NumElements((batch, t, hidden)) +
             2 * 2 * num_probs * (hidden // p.num_heads) +
             _SOFTMAX_FLOPS * num_probs)
    return LayerMeta(flops + sum(m.flops for m in metas),
                     ((batch, t, p.input_dim),),
                     sum(m.num_params for m in metas))

