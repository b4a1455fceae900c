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

Every other Keras layer that draws random numbers (attention dropout, RNN
dropout, SpatialDropout, GaussianNoise, keras_hub's Transformer layers) is
called inside keras_random.StatelessDraws: its seed generators give seeds
derived from the same (step seed, micro-batch, layer), so its recomputed
forward redraws the same numbers too.
"""

from __future__ import annotations

import contextlib
import random
import re
import weakref
from typing import Any, Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import keras_batchnorm
from gpipe_tf.layers import keras_flops
from gpipe_tf.layers import keras_native
from gpipe_tf.layers import keras_random
from gpipe_tf.layers import keras_shapes
from gpipe_tf.layers.keras_classes import FromConfig
from gpipe_tf.layers.keras_classes import KerasClassPath
from gpipe_tf.layers.keras_classes import ResolveKerasClass
from gpipe_tf.layers.keras_errors import KerasInputShapeError
from gpipe_tf.layers.keras_errors import KerasLayerError
from gpipe_tf.layers.keras_errors import KerasPrecisionError
from gpipe_tf.layers.keras_errors import KerasWeightsError
from gpipe_tf.layers.keras_errors import UnknownKerasClassError
from gpipe_tf.layers.keras_errors import UnsupportedKerasLayerError
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision

__all__ = ['KerasClassPath', 'KerasInputShapeError', 'KerasLayer',
           'KerasLayerError', 'KerasPrecisionError', 'KerasWeightsError',
           'ResolveKerasClass', 'UnknownKerasClassError',
           'UnsupportedKerasLayerError']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape

# The KerasLayers that own a Keras layer, by path, for the later calls of a
# shared layer (Params ``share``) built after them under the same parent.
_OWNERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class _Hidden:
  """Holds the Keras layer out of sight of tf.Module and tf.train.Checkpoint:
  they see only ``KerasLayer.keras_weights``, whose paths do not depend on
  Keras's own (process-dependent) layer names."""

  __slots__ = ('layer',)

  def __init__(self, layer: keras.layers.Layer) -> None:
    self.layer = layer


def _CheckConfig(name: str, cls: type, config: Any) -> dict:
  """The config without its 'name'; refuses what a pipeline cannot honour."""
  if not isinstance(config, dict):
    raise UnsupportedKerasLayerError(
        f"KerasLayer '{name}': config must be the dict get_config() returns, "
        f'got {type(config).__name__}.')
  where = f"KerasLayer '{name}' ({cls.__name__})"
  if (config.get('trainable', True) is not True and
      issubclass(cls, keras.layers.BatchNormalization)):
    raise UnsupportedKerasLayerError(
        f'{where} has trainable=False: Keras runs a frozen '
        "BatchNormalization in inference mode, which the pipeline's "
        'BatchNorm does not. Set trainable=True, or replace it by the '
        'affine map of its moving statistics.')
  for key, value in config.items():
    if key.endswith(('_regularizer', '_constraint')) and value is not None:
      raise UnsupportedKerasLayerError(
          f'{where} has {key}={value!r}: a pipeline neither adds weight '
          'regularisation penalties to the loss nor applies variable '
          'constraints. Set it to None (add a penalty to your loss_fn, or '
          'call add_loss in the layer, instead).')
  return {k: v for k, v in config.items() if k != 'name'}


def _CheckDeclared(name: str, cls: type, shapes: Any) -> list[Shape]:
  if not shapes:
    raise KerasInputShapeError(
        f"KerasLayer '{name}' ({cls.__name__}) has no input_shapes: set them, "
        'one shape per FProp input with the batch dimension first, e.g. '
        '[(None, 28, 28, 1)].')
  return [tuple(s) for s in shapes]


def _Pick(route: Any, xs: Sequence[Any]) -> Any:
  """`route` (an index or a list, tuple or dict of them) with each index
  replaced by that input."""
  if isinstance(route, dict):
    return {k: _Pick(v, xs) for k, v in route.items()}
  if isinstance(route, (list, tuple)):
    return type(route)(_Pick(v, xs) for v in route)
  return xs[route]


def _Indices(route: Any) -> list:
  if isinstance(route, dict):
    return [i for v in route.values() for i in _Indices(v)]
  if isinstance(route, (list, tuple)):
    return [i for v in route for i in _Indices(v)]
  return [route]


def _Route(p: hyperparams.Params, xs: Sequence[Any]) -> tuple[list, dict]:
  """(args, kwargs) of the Keras call for FProp inputs `xs`."""
  args = list(xs) if p.inputs is None else [_Pick(a, xs) for a in p.inputs]
  kwargs = {k: _Pick(i, xs) for k, i in p.input_kwargs.items()}
  kwargs.update(_Arrays(p.call_kwargs))
  return args, kwargs


def _Arrays(value: Any) -> Any:
  """`value` with each array constant ({'__array__': {'value', 'dtype'}},
  as FromKeras writes one) as a NumPy array."""
  if isinstance(value, dict):
    if set(value) == {'__array__'}:
      return np.asarray(value['__array__']['value'],
                        dtype=value['__array__']['dtype'])
    return {k: _Arrays(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_Arrays(v) for v in value)
  return value


def _CheckRouting(p: hyperparams.Params, num_inputs: int) -> None:
  used = _Indices(list(p.inputs or [])) + _Indices(dict(p.input_kwargs))
  used += list(p.passthrough) + [i for pair in p.input_masks for i in pair]
  bad = [i for i in used if isinstance(i, bool) or not isinstance(i, int)
         or not 0 <= i < num_inputs]
  if bad:
    raise base_layer.LayerConfigError(
        f"KerasLayer '{p.name}': inputs, input_kwargs and passthrough hold "
        f'indices of its {num_inputs} inputs (input_shapes), got {bad}.')


@contextlib.contextmanager
def _KerasPolicy(layer: keras.layers.Layer, policy: str, path: str
                 ) -> Iterator[None]:
  """Inside, `layer` and its sublayers compute under the pipeline's
  precision `policy` (their Keras dtype policy is swapped and put back), so
  that a 16-bit policy means 16-bit math in Keras layers too.

  Raises:
    KerasPrecisionError: the layer was built under another Keras policy
      than float32 and `policy`.
  """
  own = layer.dtype_policy.name
  if policy == 'float32' or own == policy:
    yield
    return
  if own != 'float32':
    raise KerasPrecisionError(
        f"KerasLayer '{path}' ({type(layer).__name__}) was built under the "
        f"Keras dtype policy {own!r} but the pipeline runs under precision "
        f"{policy!r}: build the Keras model under 'float32' and let the "
        f"pipeline's precision set the math, or set precision={own!r} (or "
        'None).')
  sublayers = list(layer._flatten_layers(include_self=True))  # pylint: disable=protected-access
  before = [l.dtype_policy for l in sublayers]
  for l in sublayers:
    l.dtype_policy = policy
  try:
    yield
  finally:
    for l, b in zip(sublayers, before):
      l.dtype_policy = b


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
  gpipe_tf layer. With ``share``, the layer builds nothing: it calls the
  Keras layer of an earlier KerasLayer under the same parent and tracks its
  variables (a Keras layer called at several places).

  Under a 16-bit precision policy (precision.Policy, PipeliningLayer
  ``precision``) the Keras layer computes under the Keras dtype policy of
  the same name for the call (its variables stay float32).

  Random draws (seed generators: GaussianNoise, SpatialDropout, attention
  and RNN dropout) are stateless seeds from (step seed, micro-batch, layer),
  repeated by a recompute (keras_random).

  A Keras BatchNormalization inside a custom layer (keras_hub's blocks)
  normalises each micro-batch with its own statistics and moves its moving
  statistics once per mini-batch, as a top-level one (keras_batchnorm).

  A loss the layer adds with ``add_loss`` in training (keras_hub's MoE
  router loss) goes to the auxiliary losses in scope (aux_losses), which
  the loss that trains the layer adds in, as Keras adds ``model.losses``.

  A frozen layer (``trainable=False``, or a frozen sublayer) keeps its
  weights as non-trainable variables: checkpointed, never differentiated
  or updated, as Keras leaves them.

  This layer deliberately does NOT run: regularisers or constraints
  (weight penalties and projections a pipeline does not apply), or a frozen
  BatchNormalization; they raise UnsupportedKerasLayerError. A Keras mask
  reaches the layer through
  ``input_masks`` (FromKeras sets them for every masked argument), since
  the attribute Keras attaches to a tensor does not cross cells.
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
             'each an index, or a list (or dict) of them for a list (dict) '
             'argument (merge layers: Add()([x, y]) is [[0, 1]]). None: '
             'every input, in order.')
    p.Define('input_kwargs', {},
             "Keyword tensor arguments of the Keras call: name -> FProp input "
             "index (or a list or dict of them), e.g. {'value': 1}.")
    p.Define('call_kwargs', {},
             'Constant keyword arguments of the Keras call (literals), e.g. '
             "{'use_causal_mask': True}.")
    p.Define('passthrough', [],
             'FProp input indices returned unchanged after the outputs.')
    p.Define('input_masks', [],
             '[input, mask] pairs of FProp input indices: before the call, '
             "input `input` carries input `mask` as its Keras mask, as "
             'Keras tensors carry theirs (Embedding mask_zero, Masking), so '
             'the layer gets it as Keras gives it (mask=, query_mask=, '
             'value_mask=, or read off the tensor).')
    p.Define('share', None,
             'The name of an earlier KerasLayer under the same parent whose '
             'Keras layer (and so variables) this one calls again: a layer '
             'called at several places (tied embeddings, a shared block). '
             'None: this layer builds its own.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    self._cls = ResolveKerasClass(p.keras_class)
    config = _CheckConfig(p.name, self._cls, p.config)
    self._shapes = _CheckDeclared(p.name, self._cls, p.input_shapes)
    _CheckRouting(p, len(self._shapes))
    native = keras_native.NativeParams(p, self._cls, self._shapes)
    self._keras = _Hidden(None)
    if native is not None:
      if p.share is not None and self._cls is not keras.layers.Dropout:
        raise UnsupportedKerasLayerError(
            f"KerasLayer '{p.name}' shares the BatchNormalization "
            f"'{p.share}', whose statistics cannot be pooled across two "
            'places: give each call its own BatchNormalization.')
      self.CreateChild('native', native)
      self.keras_weights = []
      # Statistics in float32 whatever the dtype in (as Keras does).
      self.KEEP_FLOAT32 = isinstance(self.native,
                                     normalization.BatchNormLayer)
      return
    if p.share is not None:
      owner = _OWNERS.get(f"{self.path.rpartition('/')[0]}/{p.share}")
      if owner is None or owner.p.keras_class != p.keras_class:
        raise KerasLayerError(
            f"KerasLayer '{self.path}' shares '{p.share}', which is no "
            f'KerasLayer of class {p.keras_class} built before it under the '
            'same parent: list the first call of a shared layer first.')
      self._keras = owner._keras  # pylint: disable=protected-access
      self._loop = owner._loop  # pylint: disable=protected-access
      self.keras_weights = list(owner.keras_weights)  # Tracked: read here.
      return
    with _BuildScope(self.path), _SeededInitializers(self.layer_seed):
      layer = FromConfig(self._cls, dict(config, name=self.name))
      args, kwargs = _Symbolic(p, self._shapes)
      layer(*args, **kwargs)  # Builds the variables for these shapes.
    _CheckBuilt(p.name, layer)
    _Freeze(p.name, layer)
    self._loop = _HasLoop(p.name, layer)
    self._keras = _Hidden(layer)
    self.keras_weights = [v.value for v in layer.weights]
    _OWNERS[self.path] = self

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
    for i, j in p.input_masks:
      keras.src.backend.set_keras_mask(inputs[i], inputs[j])
    if self.keras_layer is None and self.KEEP_FLOAT32:
      # float32 statistics for 16-bit inputs; a float64 model keeps float64.
      wide = tf.float64 if args[0].dtype == tf.float64 else tf.float32
      y = tf.cast(self.native.FProp(tf.cast(args[0], wide),
                                    training=training), args[0].dtype)
    elif self.keras_layer is None:
      y = self.native.FProp(*args, training=training)
    else:
      self.keras_layer._clear_losses()  # pylint: disable=protected-access
      with _KerasPolicy(self.keras_layer, precision.CurrentPolicy(),
                        self.path), keras_random.StatelessDraws(
                            self.keras_layer, self.layer_seed), (
                                keras_batchnorm.DeferInnerBatchNorms(
                                    self.keras_layer, training)), (
                                _WeightValues(self.keras_layer)
                                if self._loop
                                else contextlib.nullcontext()):
        y = self.keras_layer(*args, training=training, **kwargs)
        # In the scope: a StatelessScope (_WeightValues) holds the losses.
        _TakeLosses(self.path, self.keras_layer, training)
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
    native = keras_native.NativeParams(p, kcls, shapes)
    if native is not None:
      meta = native.cls.FPropMeta(native, shapes[(p.inputs or [0])[0]])
      return LayerMeta(meta.flops, meta.out_shapes + passed, meta.num_params)
    # The state of Python's random is restored after Keras draws seeds.
    graph = tf.Graph()
    with _SeededInitializers(0):
      name = re.sub(r'\W', '_', p.name)
      try:
        with graph.as_default():
          layer = FromConfig(kcls, dict(config, name=name))
      except Exception:  # pylint: disable=broad-except
        # A constructor that computes on tensors as NumPy arrays (keras_hub's
        # DINOV3Encoder) runs eagerly; its weights are still made in `graph`.
        layer = FromConfig(kcls, dict(config, name=name))
      with graph.as_default():
        args, kwargs = _Symbolic(p, shapes)
        outs = [tuple(t.shape) for t in keras_shapes.OutputSpecs(
            layer, args, kwargs, tf.nest.flatten(layer(*args, **kwargs)))]
        num_params = sum(base_layer.NumElements(w.shape)
                         for w in layer.weights)
        flops = keras_flops.Flops(layer, args, kwargs, outs, num_params)
    # A shared layer's variables are counted where they live.
    return LayerMeta(int(flops), tuple(outs) + passed,
                     0 if p.share is not None else int(num_params))

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


def _HasLoop(name: str, layer: keras.layers.Layer) -> bool:
  """Whether `layer` runs a recurrent layer (a tf.while_loop over time).

  A pipeline cell's programs are pruned out of one traced function
  (cell_program), and TensorFlow cannot prune a tf.while_loop that reads
  variables (lift_to_graph fails on the loop's resource outputs), so such a
  layer is called with its weights read first (_WeightValues).

  Raises:
    UnsupportedKerasLayerError: a stateful RNN (its state would carry from
      one micro-batch to the next).
  """
  rnns = [l for l in layer._flatten_layers(include_self=True)  # pylint: disable=protected-access
          if isinstance(l, keras.layers.RNN)]
  for rnn in rnns:
    if rnn.stateful:
      raise UnsupportedKerasLayerError(
          f"KerasLayer '{name}' ({type(layer).__name__}): '{rnn.name}' is "
          'stateful, so its state would pass from one micro-batch to the '
          'next: set stateful=False and feed the state as initial_state.')
  return bool(rnns)


def _TakeLosses(path: str, layer: keras.layers.Layer, training: bool
                ) -> None:
  """Moves the losses the call added (``add_loss``: keras_hub's MoE router
  load-balancing loss) to the auxiliary losses in scope (aux_losses.Add),
  in training; Keras adds them to its loss in training only."""
  losses = [x for l in layer._flatten_layers(include_self=True)  # pylint: disable=protected-access
            for x in l._get_own_losses()]  # pylint: disable=protected-access
  layer._clear_losses()  # pylint: disable=protected-access
  if training and losses:
    aux_losses.Add(tf.add_n([tf.cast(x, tf.float32) for x in losses]),
                   f"KerasLayer '{path}' ({type(layer).__name__})")


def _Freeze(name: str, layer: keras.layers.Layer) -> None:
  """Makes the weights Keras does not train (a layer or sublayer with
  trainable=False) non-trainable tf.Variables, so that no gradient is taken
  for them and no optimizer updates them; checkpoints still hold them.

  Keras marks them on its own Variable only, and its TensorFlow backend
  made them trainable tf.Variables: each is replaced by a non-trainable
  tf.Variable of the same value, name and device.

  Raises:
    UnsupportedKerasLayerError: a frozen layer holds a BatchNormalization
      (Keras would run it in inference mode; the pipeline does not).
  """
  trained = {id(w) for w in layer.trainable_weights}
  frozen = [w for w in layer.weights
            if id(w) not in trained and w.value.trainable]
  if frozen and keras_batchnorm.InnerBatchNorms(layer):
    raise UnsupportedKerasLayerError(
        f"KerasLayer '{name}' ({type(layer).__name__}) is frozen "
        '(trainable=False) and holds a BatchNormalization, which Keras '
        "would run in inference mode and the pipeline's BatchNorm does not: "
        'set trainable=True.')
  for w in frozen:
    old = w.value
    with tf.device(old.device):
      w._value = tf.Variable(old.read_value(), trainable=False,  # pylint: disable=protected-access
                             name=old.name.split(':')[0])


def _WeightValues(layer: keras.layers.Layer) -> Any:
  """A scope in which `layer`'s weights are the tensors read from them
  before the call (keras.StatelessScope), so that a tf.while_loop inside
  captures tensors, not variables; gradients flow through the reads."""
  return keras.StatelessScope(
      [(w, tf.convert_to_tensor(w.value)) for w in layer.weights],
      collect_losses=True)


def _CheckBuilt(name: str, layer: keras.layers.Layer) -> None:
  """Refuses a BatchNorm inside that cannot be deferred and variables that
  are neither weights nor seed generator states; checks the weights are
  tf.Variables."""
  where = f"KerasLayer '{name}' ({type(layer).__name__})"
  states = {id(g.state) for g in keras_random.SeedGenerators(layer)}
  weights = {id(w) for w in layer.weights}
  other = [v for v in layer.variables
           if id(v) not in weights and id(v) not in states]
  if other:
    raise UnsupportedKerasLayerError(
        f"{where} holds variable '{other[0].path}', which is neither a "
        'weight nor a seed generator\'s state (a metric?): a pipeline would '
        'neither train nor update it. Keep it out of the layer.')
  keras_batchnorm.CheckInnerBatchNorms(where, layer)
  for w in layer.weights:
    if not isinstance(w.value, tf.Variable):
      raise UnsupportedKerasLayerError(
          f"{where}: weight '{w.path}' is not backed by a tf.Variable "
          f'({type(w.value).__name__}); run Keras with the TensorFlow '
          'backend.')
