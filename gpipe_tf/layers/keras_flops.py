"""Forward FLOPs of a built Keras layer, for KerasLayer's cost estimate.

Counts Dense, EinsumDense, convolutions and MultiHeadAttention; any other
layer costs 2 x parameters x batch + its output elements.
"""

from __future__ import annotations

import math
from typing import Sequence

import keras
import tensorflow as tf

from gpipe_tf.layers import base_layer

__all__ = ['Flops']

Shape = Sequence[int | None]


def _Elements(shape: Shape) -> int:
  return base_layer.NumElements(shape)


def Flops(layer: keras.layers.Layer, args: list, kwargs: dict,
           outs: list[Shape], num_params: int) -> int:
  """Forward FLOPs of a built Keras layer called on symbolic args."""
  first = tuple(tf.nest.flatten(args)[0].shape) if args else ()
  if isinstance(layer, keras.layers.Dense):
    rows = _Elements(first[:-1])
    return 2 * rows * num_params
  if isinstance(layer, keras.layers.EinsumDense):
    return _EinsumFlops(layer.equation, first, tuple(layer.kernel.shape)) + (
        _Elements(outs[0]) if layer.bias is not None else 0)
  if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D,
                        keras.layers.Conv3D, keras.layers.DepthwiseConv2D)):
    channels_last = getattr(layer, 'data_format', 'channels_last') != (
        'channels_first')
    out_channels = outs[0][-1] if channels_last else outs[0][1]
    per_output = _Elements(layer.kernel.shape) // max(1, int(out_channels))
    return 2 * _Elements(outs[0]) * per_output + _Elements(outs[0])
  if isinstance(layer, keras.layers.MultiHeadAttention) and len(first) == 3:
    return _AttentionFlops(layer, args, kwargs, num_params)
  batch = first[0] if first and first[0] is not None else 1
  return 2 * num_params * batch + sum(_Elements(s) for s in outs)


def _EinsumFlops(equation: str, x: Shape, kernel: Shape) -> int:
  """2 x the product of every index's size in 'x,kernel->out'."""
  sizes = {}
  x_spec, k_spec = equation.split('->')[0].split(',')
  ellipsis = 1
  if '...' in x_spec:
    explicit = x_spec.replace('...', '')
    ellipsis = _Elements(x[:len(x) - len(explicit)])
    x, x_spec = x[len(x) - len(explicit):], explicit
  for spec, shape in ((x_spec, x), (k_spec, kernel)):
    for c, d in zip(spec, shape):
      sizes[c] = 1 if d is None else int(d)
  return 2 * ellipsis * math.prod(sizes.values())


def _AttentionFlops(layer: keras.layers.MultiHeadAttention, args: list,
                    kwargs: dict, num_params: int) -> int:
  """Projections (2 x rows x their weights) and the two attention einsums."""
  named = dict(zip(('query', 'value', 'key'), args))
  named.update({k: v for k, v in kwargs.items()
                if k in ('query', 'value', 'key')})
  query, value = named['query'].shape, named['value'].shape
  batch = query[0] or 1
  t, s = query[1] or 1, value[1] or 1
  heads, key_dim = layer.num_heads, layer.key_dim
  value_dim = layer.value_dim or key_dim
  # Query and output projections run per query row, key and value per key row.
  rows = {'query': t, 'attention_output': t, 'key': s, 'value': s}
  proj = sum(2 * batch * rows.get(w.path.split('/')[-2], 1) *
             _Elements(w.shape) for w in layer.weights)
  scores = 2 * batch * heads * t * s * (key_dim + value_dim)
  return proj + scores + 5 * batch * heads * t * s
