"""Core layers: activations, fully connected, dropout, and the sequential container."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.layers import skips as skips_lib

__all__ = ['Activation', 'ActivationLayer', 'AsTuple', 'BranchLayer',
           'DropoutLayer', 'FCLayer', 'FromTuple', 'InputsAndMetaOfSequence',
           'MergeLayer', 'MetaOfSequence', 'RunSequence', 'RunWithSkips',
           'SequentialLayer']

LayerMeta = base_layer.LayerMeta

_ACTIVATIONS = {
    'NONE': tf.identity,
    'RELU': tf.nn.relu,
    'RELU6': tf.nn.relu6,
    'TANH': tf.tanh,
    'SIGMOID': tf.sigmoid,
    'GELU': lambda x: tf.nn.gelu(x, approximate=True),
    'SWISH': tf.nn.silu,
}
# Rough forward cost of each activation per element, for FPropMeta.
_ACTIVATION_FLOPS = {'NONE': 0, 'RELU': 1, 'RELU6': 2, 'TANH': 4,
                     'SIGMOID': 4, 'GELU': 8, 'SWISH': 5}


def Activation(name: str):
  """The activation function called `name` (Lingvo's names: 'RELU', ...)."""
  try:
    return _ACTIVATIONS[name]
  except KeyError:
    raise base_layer.LayerConfigError(
        f'Unknown activation {name!r}; use one of '
        f'{sorted(_ACTIVATIONS)}.') from None


def AsTuple(outputs: Any) -> tuple:
  """Layer outputs as a tuple: a layer returning a tuple has several outputs."""
  return outputs if isinstance(outputs, tuple) else (outputs,)


def FromTuple(outputs: tuple) -> Any:
  return outputs[0] if len(outputs) == 1 else outputs


def _Unpack(shapes: tuple) -> tuple:
  return tuple(tuple(s) for s in shapes)


class ActivationLayer(base_layer.BaseLayer):
  """Applies an elementwise activation."""

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('activation', 'RELU', 'Activation name: ' + ', '.join(
        sorted(_ACTIVATIONS)) + '.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self._fn = Activation(self.p.activation)

  def FProp(self, x, training=False):
    return self._fn(x)

  @classmethod
  def FPropMeta(cls, p, shape):
    Activation(p.activation)
    return LayerMeta(_ACTIVATION_FLOPS[p.activation] *
                     base_layer.NumElements(shape), (tuple(shape),), 0)


class FCLayer(base_layer.BaseLayer):
  """Fully connected layer: activation(x @ w + b) on the last dimension."""

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last input dimension.')
    p.Define('output_dim', 0, 'Size of the output.')
    p.Define('activation', 'RELU', 'Activation name: ' + ', '.join(
        sorted(_ACTIVATIONS)) + '.')
    p.Define('has_bias', True, 'Whether to add a bias.')
    p.Define('bias_init', 0.0, 'Constant initial value of the bias.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    p = self.p
    if p.input_dim <= 0 or p.output_dim <= 0:
      raise base_layer.LayerConfigError(
          f"FCLayer '{self.path}' needs positive input_dim and "
          f'output_dim, got {p.input_dim} and {p.output_dim}.')
    self._fn = Activation(p.activation)
    self.CreateVariable('w', [p.input_dim, p.output_dim])
    if p.has_bias:
      from gpipe_tf.layers import initializers  # pylint: disable=g-import-not-at-top
      self.CreateVariable('b', [p.output_dim],
                          init=initializers.Constant(p.bias_init))

  def FProp(self, x, training=False):
    self.CheckLastDim(x, self.p.input_dim)
    y = tf.tensordot(x, self.w, axes=1) if x.shape.rank != 2 else tf.matmul(
        x, self.w)
    if self.p.has_bias:
      y += self.b
    return self._fn(y)

  @classmethod
  def FPropMeta(cls, p, shape):
    base_layer.CheckMetaLastDim(p, shape, p.input_dim)
    out = tuple(shape[:-1]) + (p.output_dim,)
    rows = base_layer.NumElements(shape[:-1])
    n_out = rows * p.output_dim
    flops = 2 * rows * p.input_dim * p.output_dim
    flops += n_out * (int(p.has_bias) + _ACTIVATION_FLOPS[p.activation])
    return LayerMeta(flops, (out,),
                     p.input_dim * p.output_dim + p.has_bias * p.output_dim)


class DropoutLayer(base_layer.BaseLayer):
  """Dropout with stateless masks seeded per (step, micro-batch, layer).

  The mask comes from ``random_seeds.LayerSeed``: inside a step-seed scope (the
  trainer's and the pipeline's) it is a pure function of that scope's seed and
  this layer's seed, so a recomputed forward reproduces it exactly.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping each element.')
    p.Define('noise_shape_broadcast_dims', None,
             'Optional list of dims where the mask is broadcast (size 1).')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    if not 0.0 < self.p.keep_prob <= 1.0:
      raise base_layer.LayerConfigError(
          f"DropoutLayer '{self.path}': keep_prob must be in "
          f'(0, 1], got {self.p.keep_prob}.')

  def FProp(self, x, training=False):
    if not training or self.p.keep_prob == 1.0:
      return x
    noise_shape = None
    if self.p.noise_shape_broadcast_dims:
      noise_shape = tf.unstack(tf.shape(x))
      for d in self.p.noise_shape_broadcast_dims:
        noise_shape[d] = 1
      noise_shape = tf.stack(noise_shape)
    seed = random_seeds.LayerSeed(self.layer_seed)
    return tf.nn.experimental.stateless_dropout(
        x, rate=1.0 - self.p.keep_prob, seed=seed, noise_shape=noise_shape)

  @classmethod
  def FPropMeta(cls, p, shape):
    return LayerMeta(2 * base_layer.NumElements(shape), (tuple(shape),), 0)


class BranchLayer(base_layer.BaseLayer):
  """Returns its inputs, then a copy of each of its last len(stash) inputs.

  With ``stash=names`` the copies are stashed (layers/skips.py) while the
  inputs flow on: the encoder side of a U-Net skip::

      x -> BranchLayer(stash=('s1',)) -> x     (and x stashed as 's1')

  Without a stash it is the identity.
  """

  def FProp(self, *inputs, training=False):
    n = len(self.p.stash)
    return FromTuple(tuple(inputs) + (tuple(inputs[len(inputs) - n:])
                                      if n else ()))

  @classmethod
  def FPropMeta(cls, p, *shapes):
    n = len(p.stash)
    shapes = _Unpack(shapes)
    return LayerMeta(0, shapes + (shapes[len(shapes) - n:] if n else ()), 0)


_MERGES = ('add', 'concat')


class MergeLayer(base_layer.BaseLayer):
  """Merges all its inputs into one: their sum ('add') or their
  concatenation on the last axis ('concat').

  With ``pop=names`` the popped skips are among the inputs: the decoder side
  of a U-Net skip::

      h -> MergeLayer(pop=('s1',), op='concat') -> concat(h, s1)
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('op', 'add', f'How the inputs merge: one of {_MERGES}.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    if self.p.op not in _MERGES:
      raise base_layer.LayerConfigError(
          f"MergeLayer '{self.path}': op must be one of {_MERGES}, got "
          f'{self.p.op!r}.')

  def FProp(self, *inputs, training=False):
    if self.p.op == 'add':
      return tf.add_n(list(inputs)) if len(inputs) > 1 else inputs[0]
    return tf.concat(list(inputs), axis=-1)

  @classmethod
  def FPropMeta(cls, p, *shapes):
    shapes = _Unpack(shapes)
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes) or (
        p.op == 'add' and any(s[1:] != first[1:] for s in shapes)) or (
            p.op == 'concat' and any(s[1:-1] != first[1:-1] for s in shapes)):
      raise base_layer.LayerInputError(
          f"layer '{p.name}' (MergeLayer, {p.op}) cannot merge shapes "
          f'{[list(s) for s in shapes]}')
    if p.op == 'add':
      return LayerMeta((len(shapes) - 1) * base_layer.NumElements(first),
                       (first,), 0)
    last = sum(s[-1] for s in shapes) if all(s[-1] is not None
                                             for s in shapes) else None
    return LayerMeta(0, (first[:-1] + (last,),), 0)


class SequentialLayer(base_layer.BaseLayer):
  """Runs child layers in order; the outputs of one are the inputs of the next.

  A child returning a tuple passes its elements as separate inputs to the next
  child. A child's Params ``stash`` and ``pop`` move tensors past the children
  in between (layers/skips.py). This is the unpipelined reference that
  PipeliningLayer must match.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layers', [], 'List of layer Params, run in order.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    if not self.p.layers:
      raise base_layer.LayerConfigError(
          f"SequentialLayer '{self.path}' has no layers.")
    skips_lib.Check(self.p.layers)
    self.CreateChildren('layers', self.p.layers)

  def FProp(self, *inputs, training=False):
    return RunSequence(self.layers, inputs, training)

  @classmethod
  def FPropMeta(cls, p, *shapes):
    total = MetaOfSequence(p.layers, shapes)
    return LayerMeta(sum(m.flops for m in total), total[-1].out_shapes,
                     sum(m.num_params for m in total))


def RunSequence(layers, inputs: tuple, training: bool) -> Any:
  """Runs `layers` in order on `inputs` (under the precision policy in
  force), stashing and popping skips (layers/skips.py); names both layers
  on a shape mismatch.

  Raises:
    StashNeverPoppedError: a skip is left when the last layer has run.
  """
  out, left = RunWithSkips(layers, inputs, {}, training)
  if left:
    skips_lib.Check([l.params for l in layers])  # Names the layers.
  return FromTuple(out)


def RunWithSkips(layers, inputs: tuple, popped: dict, training: bool
                 ) -> tuple[tuple, dict]:
  """Runs `layers` in order (a pipeline cell): the skips in `popped` (name
  -> tensor, stashed by earlier cells) are there for them to pop.

  Returns:
    (the last layer's outputs as a tuple, {name: tensor} of what they
    stashed and did not pop: the skips later cells pop).
  """
  xs = tuple(inputs)
  stashed = dict(popped)
  fprops = [lambda *a, l=layer: precision.RunLayer(
      l, lambda *b: l.FProp(*b, training=training), a) for layer in layers]
  i = 0
  while i < len(layers):
    layer, fprop = layers[i], fprops[i]
    xs = skips_lib.Pop(layer.params, xs, stashed)
    try:
      # Identical layers in a row run as one loop (layers/shared_run.py).
      ys, n = shared_run.Run(layers[i:], fprops[i:], xs, training)
      if n:
        i += n
        xs = ys
        continue
      ys = shared_trace.SharedCall(layer, fprop, xs, training)
      ys = AsTuple(fprop(*xs) if ys is shared_trace.NOT_SHARED else ys)
    except base_layer.LayerInputError as e:
      if i == 0:
        raise
      shapes = [getattr(x, 'shape', None) for x in xs]
      shapes = [s.as_list() if isinstance(s, tf.TensorShape) else s
                for s in shapes]
      raise base_layer.ShapeMismatchError(
          f"layer '{layers[i - 1].path}' produced {FromTuple(tuple(shapes))} "
          f"but layer '{layer.path}' cannot take it: {e}") from e
    xs = skips_lib.Stash(layer.params, ys, stashed)
    i += 1
  return xs, stashed


def MetaOfSequence(layer_params: list, shapes: tuple) -> list:
  """FPropMeta of each layer of a sequence, chaining output shapes (a
  stashed shape goes to the layer that pops it, layers/skips.py).

  Raises:
    SkipError: the layers' stash and pop names do not pair up.
  """
  return [meta for _, meta in InputsAndMetaOfSequence(layer_params, shapes)]


def InputsAndMetaOfSequence(layer_params: list, shapes: tuple) -> list:
  """Per layer of a sequence, (the input shapes it is called with, the
  shapes it pops appended; its FPropMeta): MetaOfSequence's chain, with
  what each layer takes (a layer after one that stashes takes that layer's
  outputs less the stashed ones).

  Raises:
    SkipError: the layers' stash and pop names do not pair up.
  """
  skips_lib.Check(layer_params)
  out = []
  shapes = tuple(tuple(s) for s in shapes)
  stashed: dict = {}
  for i, lp in enumerate(layer_params):
    shapes = skips_lib.Pop(lp, shapes, stashed)
    try:
      meta = lp.cls.FPropMeta(lp, *shapes)
    except base_layer.LayerInputError as e:
      if i == 0:
        raise
      raise base_layer.ShapeMismatchError(
          f"layer '{layer_params[i - 1].name}' produces "
          f"{[list(s) for s in shapes]} but layer '{lp.name}' cannot take it: "
          f'{e}') from e
    out.append((shapes, meta))
    shapes = skips_lib.Stash(lp, _Unpack(meta.out_shapes), stashed,
                             'output shapes')
  return out
