"""KerasLayer: a Keras 3 layer, declared by its class and config, run as a gpipe_tf layer.

A KerasLayer's Params hold only text-writable values: the Keras class (an
importable path such as ``'keras.layers.Dense'``, a Keras layer name such as
``'Dense'``, or a registered ``'package>Name'``), its ``get_config()`` dict,
the shapes of its inputs and how its inputs are routed. The layer is built
from them on the device in scope (its cell's, under a PipeliningLayer), with
the variable names the layer tree gives (``net/dense_1/kernel``).

Keras ``BatchNormalization`` and ``Dropout`` are NOT wrapped: the layer maps
them onto this project's ``BatchNormLayer`` and ``DropoutLayer`` (child
``native``; same variable names: gamma, beta, moving_mean, moving_variance).
A wrapped Keras BatchNormalization would move its moving statistics once per
micro-batch, and again in every recomputed forward; a wrapped Keras Dropout
draws its masks from a stateful seed generator, so a recomputed forward would
drop other units than the forward it replays. The project's layers defer the
moving statistics to one update per mini-batch and draw stateless masks from
(step seed, micro-batch, layer), so the pipeline stays exact.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import random
import re
from typing import Any, Iterator, Sequence

import keras
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization

__all__ = ['KerasClassPath', 'KerasInputShapeError', 'KerasLayer',
           'KerasLayerError', 'KerasWeightsError', 'ResolveKerasClass',
           'UnknownKerasClassError', 'UnsupportedKerasLayerError']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

# Keras initialisers BatchNormLayer starts from (their class names).
_BATCH_NORM_INITS = {'gamma_initializer': 'Ones', 'beta_initializer': 'Zeros',
                     'moving_mean_initializer': 'Zeros',
                     'moving_variance_initializer': 'Ones'}


class KerasLayerError(errors.Error, ValueError):
  """Base of the errors raised while bringing Keras layers into gpipe_tf."""


class UnknownKerasClassError(KerasLayerError):
  """``keras_class`` names no importable or registered Keras layer class."""


class KerasInputShapeError(KerasLayerError):
  """A Keras layer (or model) lacks the input shapes needed to build it."""


class UnsupportedKerasLayerError(KerasLayerError):
  """A Keras layer a pipeline could not run exactly, or Params cannot hold."""


class KerasWeightsError(KerasLayerError):
  """Weights copied from a Keras layer that does not match the built layer."""


class _Hidden:
  """Holds the Keras layer out of sight of tf.Module and tf.train.Checkpoint:
  they see only ``KerasLayer.keras_weights``, whose paths do not depend on
  Keras's own (process-dependent) layer names."""

  __slots__ = ('layer',)

  def __init__(self, layer: keras.layers.Layer) -> None:
    self.layer = layer


def ResolveKerasClass(name: str) -> type:
  """The Keras layer class `name` names (see KerasLayer Params keras_class).

  Raises:
    UnknownKerasClassError: `name` names nothing, or not a Keras layer class.
  """
  cls = None
  if isinstance(name, str) and name:
    if '.' in name and '>' not in name:
      module_name, _, attr = name.rpartition('.')
      try:
        cls = getattr(importlib.import_module(module_name), attr, None)
      except ImportError:
        cls = None
    else:
      cls = (keras.saving.get_registered_object(name) or
             getattr(keras.layers, name, None))
  if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
    raise UnknownKerasClassError(
        f'keras_class {name!r} is not a Keras layer class. Give an importable '
        "path ('keras.layers.Dense', 'mypackage.layers.MyBlock'), a Keras "
        "layer name ('Dense') or the registered name ('package>Name') of a "
        'class decorated with @keras.saving.register_keras_serializable.')
  return cls


def KerasClassPath(cls: type) -> str:
  """The text a KerasLayer's ``keras_class`` holds for Keras layer class `cls`.

  Raises:
    UnknownKerasClassError: `cls` can be neither imported nor looked up by a
      registered name (e.g. it was defined inside a function).
  """
  for module in ('keras.layers', 'keras'):
    if getattr(importlib.import_module(module), cls.__name__, None) is cls:
      return f'{module}.{cls.__name__}'
  registered = keras.saving.get_registered_name(cls)
  if '>' in registered and keras.saving.get_registered_object(
      registered) is cls:
    return registered
  if '<locals>' in cls.__qualname__ or '.' in cls.__qualname__:
    raise UnknownKerasClassError(
        f'Keras layer class {cls.__qualname__} cannot be named in Params: '
        'define it at the top level of a module, or register it with '
        '@keras.saving.register_keras_serializable(package=...).')
  return f'{cls.__module__}.{cls.__qualname__}'


def _CheckConfig(name: str, cls: type, config: Any) -> dict:
  """The config without its 'name'; refuses what a pipeline cannot honour."""
  if not isinstance(config, dict):
    raise UnsupportedKerasLayerError(
        f"KerasLayer '{name}': config must be the dict get_config() returns, "
        f'got {type(config).__name__}.')
  where = f"KerasLayer '{name}' ({cls.__name__})"
  if config.get('trainable', True) is not True:
    raise UnsupportedKerasLayerError(
        f'{where} has trainable=False. Set it to True and leave the frozen '
        'variables out of the optimizer instead.')
  for key, value in config.items():
    if key.endswith(('_regularizer', '_constraint')) and value is not None:
      raise UnsupportedKerasLayerError(
          f'{where} has {key}={value!r}: a pipeline neither adds Keras layer '
          'losses to the loss nor applies variable constraints. Set it to '
          'None (add a penalty to your loss_fn instead).')
  return {k: v for k, v in config.items() if k != 'name'}


def _CheckDeclared(name: str, cls: type, shapes: Any) -> list[Shape]:
  if not shapes:
    raise KerasInputShapeError(
        f"KerasLayer '{name}' ({cls.__name__}) has no input_shapes: set them, "
        'one shape per FProp input with the batch dimension first, e.g. '
        '[(None, 28, 28, 1)].')
  return [tuple(s) for s in shapes]


def _NativeParams(p: hyperparams.Params, cls: type, shapes: Sequence[Shape]
                  ) -> hyperparams.InstantiableParams | None:
  """This project's layer standing in for Keras BatchNormalization or
  Dropout (module docstring), or None for every other class."""
  if not issubclass(cls, (keras.layers.BatchNormalization,
                          keras.layers.Dropout)):
    return None
  where = f"KerasLayer '{p.name}' ({cls.__name__})"
  if cls not in (keras.layers.BatchNormalization, keras.layers.Dropout):
    raise UnsupportedKerasLayerError(
        f'{where} subclasses {cls.__mro__[1].__name__}, which is run as this '
        "project's own layer; a subclass's changes would be lost. Use the "
        'Keras class itself.')
  if p.inputs not in (None, [0], (0,)) or p.input_kwargs or p.call_kwargs:
    raise UnsupportedKerasLayerError(
        f'{where} takes one tensor input; set inputs=None or [0] and no '
        'input_kwargs or call_kwargs.')
  c = p.config
  base = dict(random_seed=p.random_seed, dtype=p.dtype)
  if cls is keras.layers.Dropout:
    noise = c.get('noise_shape')
    dims = [i for i, d in enumerate(noise) if d == 1] if noise else None
    return core.DropoutLayer.Params().Set(
        keep_prob=1.0 - float(c.get('rate', 0.0)),
        noise_shape_broadcast_dims=dims, **base)
  rank = len(shapes[0])
  axis = c.get('axis', -1)
  axis = list(axis) if isinstance(axis, (list, tuple)) else [axis]
  problems = [f'{k}={c[k]!r} (use {v!r})' for k, v in (
      ('center', True), ('scale', True), ('renorm', False)) if k in c
              and c[k] != v]
  if [a % rank for a in axis] != [rank - 1]:
    problems.append(f'axis={c.get("axis")!r} (use -1)')
  for key, want in _BATCH_NORM_INITS.items():
    init = c.get(key)
    got = init.get('class_name') if isinstance(init, dict) else init
    if got is not None and str(got).lower() != want.lower():
      problems.append(f'{key}={got!r} (use {want!r})')
  if problems:
    raise UnsupportedKerasLayerError(
        f"{where} runs as gpipe_tf's BatchNormLayer, which needs: "
        + ', '.join(problems) + '.')
  return normalization.BatchNormLayer.Params().Set(
      dim=int(shapes[0][-1]), decay=float(c.get('momentum', 0.99)),
      epsilon=float(c.get('epsilon', 1e-3)),
      cross_replica_normalization=bool(c.get('synchronized', False)), **base)


def _Route(p: hyperparams.Params, xs: Sequence[Any]) -> tuple[list, dict]:
  """(args, kwargs) of the Keras call for FProp inputs `xs`."""
  if p.inputs is None:
    args = list(xs)
  else:
    args = [[xs[i] for i in a] if isinstance(a, (list, tuple)) else xs[a]
            for a in p.inputs]
  kwargs = {k: xs[i] for k, i in p.input_kwargs.items()}
  kwargs.update(p.call_kwargs)
  return args, kwargs


def _CheckRouting(p: hyperparams.Params, num_inputs: int) -> None:
  used = [i for a in (p.inputs or []) for i in (
      a if isinstance(a, (list, tuple)) else [a])]
  used += list(p.input_kwargs.values()) + list(p.passthrough)
  bad = [i for i in used if isinstance(i, bool) or not isinstance(i, int)
         or not 0 <= i < num_inputs]
  if bad:
    raise base_layer.LayerConfigError(
        f"KerasLayer '{p.name}': inputs, input_kwargs and passthrough hold "
        f'indices of its {num_inputs} inputs (input_shapes), got {bad}.')


def _BuildScope(path: str):
  """The absolute name scope that makes Keras name variables `path`/...."""
  parent = path.rpartition('/')[0]
  return tf.name_scope(parent + '/') if parent else contextlib.nullcontext()


@contextlib.contextmanager
def _SeededInitializers(seed: int) -> Iterator[None]:
  """Makes the seeds Keras gives unseeded initialisers a function of `seed`.

  Keras draws them from Python's ``random`` (random.make_default_seed) when
  an initialiser is made, also for the copies a layer makes for its
  sublayers; seeding it here, and restoring its state after, gives the same
  initial values in every build of the same layer path.
  """
  state = random.getstate()
  random.seed(seed)
  try:
    yield
  finally:
    random.setstate(state)


class KerasLayer(base_layer.BaseLayer):
  """A Keras 3 layer built from ``keras_class`` and ``config`` on its device.

  FProp(*inputs) calls the Keras layer on the inputs picked by ``inputs`` and
  ``input_kwargs`` (plus constant ``call_kwargs``), with ``training``, and
  returns its outputs (flattened) followed by the inputs named in
  ``passthrough``. So a chain of KerasLayers carries a tuple of live tensors
  (a residual stream beside a branch) between pipeline cells::

      (x,)  -LayerNorm, passthrough [0]->  (h, x)
      (h, x) -MultiHeadAttention inputs [0, 0], passthrough [1]->  (a, x)
      (a, x) -Add inputs [[1, 0]]->  (y,)

  Variables: the Keras layer's weights, in its ``weights`` order, kept as
  ``keras_weights`` (the backing tf.Variables of the Keras variables), so
  ``trainable_variables`` and checkpoints see them at paths that follow the
  layer tree: the same under a SequentialLayer and any PipeliningLayer. Their
  initial values are a function of the layer path and ``random_seed`` (the
  seeds of unseeded Keras initialisers are drawn from it), as for every
  gpipe_tf layer.

  This layer deliberately does NOT run: Keras layers with stateful randomness
  (seed generators: GaussianNoise, SpatialDropout, attention dropout > 0), any
  layer holding a BatchNormalization inside (a nested model: bring its layers
  one by one), regularisers or constraints (losses and projections a pipeline
  does not apply), or ``trainable=False``; they raise
  UnsupportedKerasLayerError. Keras masks are not propagated.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('keras_class', None,
             "The Keras layer class: an importable path ('keras.layers."
             "Dense'), a Keras layer name ('Dense') or a registered name "
             "('package>Name').")
    p.Define('config', {},
             "The layer's get_config() dict (literals only; its 'name' is "
             'ignored: Params.name names the layer).')
    p.Define('input_shapes', None,
             'One shape per FProp input, batch dimension first (None for '
             'unknown dimensions), e.g. [(None, 28, 28, 1)]; the layer is '
             'built for them.')
    p.Define('inputs', None,
             "The Keras call's positional arguments as FProp input indices: "
             'each an index, or a list of indices for a list argument '
             '(merge layers: Add()([x, y]) is [[0, 1]]). None: every input, '
             'in order.')
    p.Define('input_kwargs', {},
             "Keyword tensor arguments of the Keras call: name -> FProp input "
             "index, e.g. {'value': 1}.")
    p.Define('call_kwargs', {},
             'Constant keyword arguments of the Keras call (literals), e.g. '
             "{'use_causal_mask': True}.")
    p.Define('passthrough', [],
             'FProp input indices returned unchanged after the outputs.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    self._cls = ResolveKerasClass(p.keras_class)
    config = _CheckConfig(p.name, self._cls, p.config)
    self._shapes = _CheckDeclared(p.name, self._cls, p.input_shapes)
    _CheckRouting(p, len(self._shapes))
    native = _NativeParams(p, self._cls, self._shapes)
    self._keras = _Hidden(None)
    if native is not None:
      self.CreateChild('native', native)
      self.keras_weights = []
      return
    with _BuildScope(self.path), _SeededInitializers(self.layer_seed):
      layer = self._cls.from_config(dict(config, name=self.name))
      args, kwargs = _Symbolic(p, self._shapes)
      layer(*args, **kwargs)  # Builds the variables for these shapes.
    _CheckBuilt(p.name, layer)
    self._keras = _Hidden(layer)
    self.keras_weights = [v.value for v in layer.weights]

  @property
  def keras_layer(self) -> keras.layers.Layer | None:
    """The built Keras layer; None where a project layer stands in for it."""
    return self._keras.layer

  def FProp(self, *inputs: Any, training: bool = False) -> Any:
    """The Keras layer's outputs, then the ``passthrough`` inputs."""
    p = self.p
    _CheckShapes(p, self._cls, self._shapes,
                 [getattr(x, 'shape', None) for x in inputs], self.path)
    args, kwargs = _Route(p, inputs)
    if self.keras_layer is None:
      y = self.native.FProp(*args, training=training)
    else:
      y = self.keras_layer(*args, training=training, **kwargs)
    outs = tuple(tf.nest.flatten(y)) + tuple(inputs[i] for i in p.passthrough)
    return core.FromTuple(outs)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Shape
                ) -> LayerMeta:
    """Counts Dense, EinsumDense, convolutions and MultiHeadAttention; other
    layers cost 2 x parameters x batch + output elements. Builds nothing
    that holds memory (the Keras layer is built in a throwaway tf.Graph)."""
    kcls = ResolveKerasClass(p.keras_class)
    config = _CheckConfig(p.name, kcls, p.config)
    declared = _CheckDeclared(p.name, kcls, p.input_shapes)
    shapes = [tuple(s) for s in input_shapes] or declared
    _CheckShapes(p, kcls, declared, shapes)
    _CheckRouting(p, len(shapes))
    passed = tuple(shapes[i] for i in p.passthrough)
    native = _NativeParams(p, kcls, shapes)
    if native is not None:
      meta = native.cls.FPropMeta(native, shapes[0])
      return LayerMeta(meta.flops, meta.out_shapes + passed, meta.num_params)
    # The state of Python's random is restored after Keras draws seeds.
    with tf.Graph().as_default(), _SeededInitializers(0):
      layer = kcls.from_config(dict(config, name=re.sub(r'\W', '_', p.name)))
      args, kwargs = _Symbolic(p, shapes)
      outs = [tuple(t.shape) for t in tf.nest.flatten(layer(*args, **kwargs))]
      num_params = sum(base_layer.NumElements(w.shape) for w in layer.weights)
      flops = _Flops(layer, args, kwargs, outs, num_params)
    return LayerMeta(int(flops), tuple(outs) + passed, int(num_params))

  def LoadKerasWeights(self, source: keras.layers.Layer
                       ) -> list[tuple[Any, tf.Variable]]:
    """Assigns the weights of Keras layer `source` (of this class) to this
    layer's variables.

    Returns:
      (source's Keras variable, this layer's tf.Variable) pairs.

    Raises:
      KerasWeightsError: `source` has another class or other weight shapes.
    """
    if type(source) is not self._cls:  # pylint: disable=unidiomatic-typecheck
      raise KerasWeightsError(
          f"layer '{self.path}' is a {self._cls.__name__} but the weights "
          f"come from '{source.name}', a {type(source).__name__}: load from "
          'the Keras model the Params were imported from.')
    if self.keras_layer is not None:
      targets = list(self.keras_weights)
    elif isinstance(self.native, normalization.BatchNormLayer):
      targets = [getattr(self.native, w.name, None) for w in source.weights]
    else:
      targets = []
    pairs = list(zip(source.weights, targets))
    if len(source.weights) != len(targets) or any(
        t is None or tuple(s.shape) != tuple(t.shape) for s, t in pairs):
      raise KerasWeightsError(
          f"layer '{self.path}' has variables of shapes "
          f'{[tuple(t.shape) for t in targets if t is not None]} but Keras '
          f"layer '{source.name}' has "
          f'{[(w.name, tuple(w.shape)) for w in source.weights]}: build both '
          'from the same config and input shapes.')
    for s, t in pairs:
      t.assign(tf.cast(s.value, t.dtype))
    return pairs


def _CheckShapes(p: hyperparams.Params, cls: type, declared: Sequence[Shape],
                 got: Sequence[Any], path: str | None = None) -> None:
  """Raises LayerInputError unless `got` fits the declared input shapes."""
  got = [tf.TensorShape(g) for g in got]
  if len(got) != len(declared) or not all(
      tf.TensorShape(s).is_compatible_with(g) for s, g in zip(declared, got)):
    raise base_layer.LayerInputError(
        f"layer '{path or p.name}' (KerasLayer {cls.__name__}) expects inputs "
        f'of shapes {list(declared)} but got '
        f'{[g.as_list() if g.rank is not None else None for g in got]}')


def _Symbolic(p: hyperparams.Params, shapes: Sequence[Shape]
              ) -> tuple[list, dict]:
  """Keras symbolic tensors of `shapes`, routed as FProp routes inputs."""
  return _Route(p, [keras.KerasTensor(s) for s in shapes])


def _CheckBuilt(name: str, layer: keras.layers.Layer) -> None:
  """Refuses stateful randomness and BatchNorm inside; checks the variables
  are tf.Variables."""
  where = f"KerasLayer '{name}' ({type(layer).__name__})"
  if len(layer.variables) != len(layer.weights):
    raise UnsupportedKerasLayerError(
        f'{where} draws random numbers from a Keras seed generator, so a '
        'recomputed forward would not repeat them: remove the randomness '
        '(e.g. dropout=0.0) and use keras.layers.Dropout as its own layer, '
        "which runs as gpipe_tf's DropoutLayer.")
  sublayers = layer._flatten_layers(include_self=False)  # pylint: disable=protected-access
  inner = [l for l in sublayers
           if isinstance(l, keras.layers.BatchNormalization)]
  if inner:
    raise UnsupportedKerasLayerError(
        f"{where} holds BatchNormalization '{inner[0].name}', whose moving "
        'statistics would move once per micro-batch and recomputation: '
        'bring its layers one by one (FromKeras a flat functional model).')
  for w in layer.weights:
    if not isinstance(w.value, tf.Variable):
      raise UnsupportedKerasLayerError(
          f"{where}: weight '{w.path}' is not backed by a tf.Variable "
          f'({type(w.value).__name__}); run Keras with the TensorFlow '
          'backend.')


def _Elements(shape: Shape) -> int:
  return base_layer.NumElements(shape)


def _Flops(layer: keras.layers.Layer, args: list, kwargs: dict,
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
