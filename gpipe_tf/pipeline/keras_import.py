"""FromKeras: a Keras Sequential or functional model as the list of layer Params a pipeline takes, and its weights.

``FromKeras(model)`` walks the model's graph (keras_graph.Walk: nested
functional models inlined) and gives one Params per call: a ``KerasLayer``
per layer call, a ``KerasOpLayer`` per operation node (``x + y``,
``keras.ops.*``). A functional model whose layers branch and merge (residual
blocks) becomes a chain: each layer reads its arguments from the tuple it
gets and returns its outputs followed by the tensors still live
(``inputs`` / ``passthrough``). A tensor the very next call reads rides in
that tuple; one whose next reader is further on is stashed (layers/skips.py)
by the first call that has it and does not read it next (its maker's
successor, or the call that last read it), and popped by the call that reads
it: a pipeline sends it straight from cell to cell, and the cells in between
never hold it. For a pre-norm residual block::

    keras graph                       chain of Params (tuple after each)
    x -> LayerNorm -> h               ln:   (x,)   -> (h, x)
    h -> MultiHeadAttention(h, h) -> a  mha: (h, x) -> (a, x)
    x + a -> y                        add:  (a, x) -> (y,)

and for a U-Net's long skip, ``e`` read by the decoder four calls later::

    conv1: (x,) -> (e,)   pool1: (e,) -> (p,) stash 'e'   ...
    up1: (u,) pop 'e' -> (u, e) read as the concat's inputs

The cut between two pipeline cells passes the tuple; ``FromKeras(model,
skips=False)`` carries every live tensor in it instead (what it did before
stash/pop, kept for comparison: benchmarks/skips). A model
with several inputs starts with ``KerasInputs`` (fed as Keras is fed: a
dict keyed by input name, or positionally when its inputs are a list); one
with several outputs ends with ``KerasOutputs`` (the model's list or dict).
A layer called at several places is built once, at its first call; each
later call's KerasLayer reads its variables (Params ``share``), so they get
the sum of the gradients of every call, as in Keras.

``LoadKerasWeights(layer, model)`` copies the model's weights into a built
SequentialLayer or PipeliningLayer (or any tf.Module holding KerasLayers)
over those Params.

A layer's config comes from keras_config.Config: its get_config() when that
round-trips, else its constructor arguments (recorded by Keras, or read back
from its attributes and checked by its outputs).

A Keras mask rides beside its tensor: each call reads the masks its
arguments carry (keras_graph.Call.masks) like any other tensor, and a
KerasLayer's ``input_masks`` hands them to the Keras layer on its inputs.

This module deliberately does NOT convert a subclassed model (it has no
graph: its layers can be imported one by one), a nested model called on a
masked tensor, an output without one row per example (a pipeline joins
micro-batches' outputs along the first dimension), or a call with
constant positional arguments to a layer (not an operation); it raises
KerasModelError saying what to change.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import keras_layer
from gpipe_tf.layers import keras_ops
from gpipe_tf.pipeline import keras_config
from gpipe_tf.pipeline import keras_graph

__all__ = ['FromKeras', 'KerasModelError', 'LoadKerasWeights']

KerasModelError = keras_graph.KerasModelError


def FromKeras(model: keras.Model, skips: bool = True
              ) -> list[hyperparams.InstantiableParams]:
  """The layer Params of each call of `model`, in an order that runs.

  Feed the result to ``SequentialLayer`` or ``PipeliningLayer`` Params
  ``layers``, build it, then ``LoadKerasWeights`` to start from the model's
  weights. The Params are named after the Keras layers and operations.

  Args:
    model: a built ``keras.Sequential`` or functional ``keras.Model`` (from
      ``keras.Input``), with any number of inputs and outputs.
    skips: stash a tensor whose next reader is not the next call, and pop
      it there (module docstring); False: carry it in the tuple through
      every call in between.

  Raises:
    KerasInputShapeError: the model has no input shape yet.
    KerasModelError: a part of the model a chain cannot hold (see the
      module docstring); the message names it.
    UnknownKerasClassError, UnsupportedKerasLayerError: a layer cannot be
      declared or run exactly (keras_layer).
  """
  graph = keras_graph.Walk(model)
  tensors = graph.tensors
  flat_outputs = keras.tree.flatten(graph.outputs)
  last_use, uses = {}, {}
  for i, call in enumerate(graph.calls):
    for k in _Reads(call):
      last_use[k] = i
      uses.setdefault(k, []).append(i)
  for k in flat_outputs:
    last_use[k] = len(graph.calls)
    uses.setdefault(k, []).append(len(graph.calls))

  def _NextUse(k, i):
    return min((j for j in uses.get(k, ()) if j > i), default=None)

  stashed: dict = {}  # Key -> the name it is stashed under.
  live = list(graph.inputs)
  params = []
  if len(graph.inputs) > 1 or graph.dict_inputs:
    params.append(keras_ops.KerasInputs.Params().Set(
        name='inputs', names=list(graph.input_names),
        by_name_only=graph.dict_inputs, input_shapes=_Shapes(live, tensors),
        input_dtypes=[_Dtype(tensors[k]) for k in live]))
  for i, call in enumerate(graph.calls):
    popped = [k for k in _Unique(_Reads(call)) if k in stashed]
    pop = [stashed.pop(k) for k in popped]
    live = live + popped
    index = {}
    for j, k in enumerate(live):
      index.setdefault(k, j)
    keep = [k for k in _Unique(live) if last_use.get(k, -1) > i]
    stash = []
    if skips:
      stash = [k for k in keep if _NextUse(k, i) > i + 1]
      keep = [k for k in keep if k not in stash]
    names = [f'{call.name}/{j}:{_SkipName(k, tensors)}'
             for j, k in enumerate(stash)]
    stashed.update(zip(stash, names))
    where = f"Keras model '{model.name}': '{call.name}'"
    common = dict(name=call.name, input_shapes=_Shapes(live, tensors),
                  passthrough=[index[k] for k in keep + stash],
                  stash=names, pop=pop)
    if isinstance(call.operation, keras.layers.Layer):
      params.append(_LayerParams(call, index, where, tensors).Set(
          **common))
    else:
      params.append(_OpParams(call, index, where, live, tensors).Set(
          **common))
    live = list(call.outputs) + keep
  if not graph.calls:
    raise KerasModelError(
        f"Keras model '{model.name}' has no layer or operation between its "
        'inputs and outputs.')
  popped = list(stashed)
  pop = [stashed.pop(k) for k in popped]
  live = live + popped
  index = {}
  for j, k in enumerate(live):
    index.setdefault(k, j)
  if not _IsKey(graph.outputs) or live != flat_outputs:
    params.append(keras_ops.KerasOutputs.Params().Set(
        name='outputs', input_shapes=_Shapes(live, tensors),
        structure=_Template(graph.outputs, index), pop=pop))
  _CheckBatchedOutputs(model, graph)
  return params


def _CheckBatchedOutputs(model: keras.Model, graph: keras_graph.Graph
                         ) -> None:
  """Refuses an output whose first dimension is a fixed size while the
  inputs' batch size is not fixed: a pipeline joins its micro-batches'
  outputs along that dimension, so it would return M copies where Keras
  returns one (SAM's dense positional embedding, batch 1 for any batch)."""
  if not any(len(graph.tensors[k].shape) and graph.tensors[k].shape[0] is None
             for k in graph.inputs):
    return
  for name, k in _Named(graph.outputs, 'output'):
    shape = graph.tensors[k].shape
    if not len(shape) or shape[0] is not None:
      raise KerasModelError(
          f"Keras model '{model.name}': {name} has shape "
          f'{tuple(shape)}, not one row per example, and a pipeline joins '
          "its micro-batches' outputs along the first dimension (it would "
          'return one copy per micro-batch): leave it out of the outputs, '
          'or tile it to the batch (keras.ops.broadcast_to).')


def _Named(value: Any, name: str) -> list:
  """(a readable name, Key) of each Key in an output structure."""
  if _IsKey(value):
    return [(name, value)]
  if isinstance(value, dict):
    return [p for k, v in value.items() for p in _Named(v, f'{name} {k!r}')]
  if isinstance(value, (list, tuple)):
    return [p for i, v in enumerate(value) for p in _Named(v, f'{name} {i}')]
  return []


def _Reads(call: keras_graph.Call) -> list:
  """The Keys a call reads: its arguments', and a layer's the masks they
  carry (Keras hands a layer the masks of its inputs; operations ignore
  them)."""
  keys = _Keys((call.args, call.kwargs))
  if isinstance(call.operation, keras.layers.Layer):
    keys += list(call.masks.values())
  return keys


def _Unique(keys: list) -> list:
  return list(dict.fromkeys(keys))


def _SkipName(key: Any, tensors: dict) -> str:
  """A readable stash name of a tensor: its Keras name."""
  return str(getattr(tensors[key], 'name', None) or key)


def _IsKey(value: Any) -> bool:
  return isinstance(value, keras_graph.Key)


def _Keys(value: Any) -> list:
  if _IsKey(value):
    return [value]
  if isinstance(value, (list, tuple)):
    return [k for v in value for k in _Keys(v)]
  if isinstance(value, dict):
    return [k for v in value.values() for k in _Keys(v)]
  return []


def _Template(value: Any, index: dict) -> Any:
  """`value` with its Keys as {'__input__': i} (keras_ops templates)."""
  if _IsKey(value):
    return {'__input__': index[value]}
  if isinstance(value, (list, tuple)):
    return type(value)(_Template(v, index) for v in value)
  if isinstance(value, dict):
    return {k: _Template(v, index) for k, v in value.items()}
  return value


def _Shapes(keys: list, tensors: dict) -> list:
  return [tuple(tensors[k].shape) for k in keys]


def _Dtype(tensor: Any) -> str:
  return keras.backend.standardize_dtype(tensor.dtype)


def _LayerParams(call: keras_graph.Call, index: dict, where: str,
                 tensors_of: dict) -> hyperparams.InstantiableParams:
  """A KerasLayer's Params for a layer call."""
  layer = call.operation

  def _Index(value, what):
    if _Keys(value) and _IsIndexable(value):
      return _Indices(value, index)
    raise KerasModelError(
        f'{where} ({type(layer).__name__}) takes {what} {value!r} mixing '
        'tensors and constants; a pipeline layer takes tensors (or a list or '
        'dict of them) as positional arguments and constants by keyword: '
        "call the layer so, or set the constant in the layer's config.")

  tensors, constants = {}, {}
  args, named = _Positional(layer, call.args)
  args = [_Index(a, 'positional argument') for a in args]
  for key, value in list(named.items()) + list(call.kwargs.items()):
    if key == 'training' or (key.endswith('mask') and value is None):
      continue  # The pipeline passes training; Keras adds mask=None.
    if _Keys(value):
      tensors[key] = _Index(value, f'keyword argument {key}')
    else:
      constants[key] = _Constant(call.name, key, keras_config.Plain(value))
  config = keras_config.Config(layer, call, tensors_of, where)
  return keras_layer.KerasLayer.Params().Set(
      keras_class=keras_layer.KerasClassPath(type(layer)), config=config,
      inputs=args, input_kwargs=tensors, call_kwargs=constants,
      input_masks=[[index[k], index[m]] for k, m in call.masks.items()],
      share=call.first)


def _Constant(name: str, key: str, value: Any) -> Any:
  """A constant keyword argument of a layer call as Params hold it: literals
  as they are, a NumPy array or tensor constant (BLIP2's position ids) as
  its numbers and dtype (keras_ops' ``{'__array__': ...}``, decoded by
  KerasLayer).

  Raises:
    UnsupportedKerasLayerError: any other object, or a too large array.
  """
  if any(isinstance(v, (np.ndarray, tf.Tensor)) and
         not isinstance(v, keras.KerasTensor)
         for v in tf.nest.flatten(value)):
    value = keras_ops.EncodeArguments(
        value, None, f"Keras layer '{name}': its keyword argument {key}")
  keras_config.CheckLiteral(name, value, f'keyword argument {key}')
  return value


def _Positional(layer: keras.layers.Layer, args: Sequence[Any]
                ) -> tuple[list, dict]:
  """(the leading positional arguments that hold tensors, the others by
  the names of `layer.call`'s parameters).

  A constant passed positionally (keras_hub's RWKV7Backbone calls
  ``block(x, None, padding_mask)``) is passed by keyword instead, and so is
  every argument after it; without names for them (``*args``) they stay
  positional (and _LayerParams refuses a constant among them).
  """
  first = next((i for i, a in enumerate(args)
                if not (_Keys(a) and _IsIndexable(a))), len(args))
  params = list(inspect.signature(layer.call).parameters.values())
  kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD,
           inspect.Parameter.KEYWORD_ONLY)
  if first == len(args) or len(params) < len(args) or any(
      p.kind not in kinds for p in params[first:len(args)]):
    return list(args), {}
  return list(args[:first]), {p.name: a for p, a in
                              zip(params[first:len(args)], args[first:])}


def _IsIndexable(value: Any) -> bool:
  """Whether `value` is Keys only, in lists, tuples and dicts."""
  if _IsKey(value):
    return True
  if isinstance(value, (list, tuple)):
    return all(_IsIndexable(v) for v in value)
  if isinstance(value, dict):
    return all(_IsIndexable(v) for v in value.values())
  return False


def _Indices(value: Any, index: dict) -> Any:
  if _IsKey(value):
    return index[value]
  if isinstance(value, dict):
    return {k: _Indices(v, index) for k, v in value.items()}
  return [_Indices(v, index) for v in value]


def _OpParams(call: keras_graph.Call, index: dict, where: str, live: list,
              tensors: dict) -> hyperparams.InstantiableParams:
  """A KerasOpLayer's Params for an operation node."""
  op = call.operation
  config = op.get_config()
  keras_config.CheckLiteral(call.name, config, 'config')
  try:
    path = keras_layer.KerasClassPath(type(op))
  except keras_layer.UnknownKerasClassError:
    path = f'{type(op).__module__}.{type(op).__qualname__}'
  where = f'{where} (operation {type(op).__name__})'
  keys = lambda v: _Template(v, index)  # pylint: disable=unnecessary-lambda-assignment
  return keras_ops.KerasOpLayer.Params().Set(
      op=path, config=config,
      input_dtypes=[_Dtype(tensors[k]) for k in live],
      args=_Encode(list(call.args), keys, where),
      kwargs=_Encode(dict(call.kwargs), keys, where))


def _Encode(value: Any, keys: Any, where: str) -> Any:
  """The keras_ops template of an argument holding Keys."""
  value = keys(value)
  return keras_ops.EncodeArguments(value, None, where + ' argument')


def LoadKerasWeights(layer: tf.Module, model: keras.Model
                     ) -> list[tuple[Any, tf.Variable]]:
  """Copies `model`'s weights into the KerasLayers of built `layer`.

  Each KerasLayer takes the weights of the model's layer of the same name
  (FromKeras names the Params after the Keras layers' calls); the later
  calls of a shared layer read the first call's variables.

  Args:
    layer: a SequentialLayer, PipeliningLayer or any tf.Module holding the
      KerasLayers built from ``FromKeras(model)``.
    model: the Keras model.

  Returns:
    (Keras variable, tf.Variable of `layer`) pairs, one per weight.

  Raises:
    KerasWeightsError: a KerasLayer has no same-named layer in `model`, a
      weighted layer of `model` has no KerasLayer, or shapes differ.
  """
  by_name = {c.name: c.operation for c in keras_graph.Walk(model).calls
             if c.first is None and
             isinstance(c.operation, keras.layers.Layer)}
  found = [m for m in (layer,) + tuple(layer.submodules)
           if isinstance(m, keras_layer.KerasLayer) and m.p.share is None]
  unknown = [m.p.name for m in found if m.p.name not in by_name]
  missing = sorted(set(n for n, l in by_name.items() if l.weights) -
                   set(m.p.name for m in found))
  if unknown or missing:
    raise keras_layer.KerasWeightsError(
        f"Keras model '{model.name}' and the built layer "
        f"'{getattr(layer, 'path', layer.name)}' do not match: KerasLayers "
        f'without a Keras layer of their name: {unknown}; Keras layers with '
        f'weights and no KerasLayer: {missing}. '
        'Build the layer from FromKeras(model) and keep the Params names.')
  pairs = []
  for m in found:
    pairs += m.LoadKerasWeights(by_name[m.p.name])
  return pairs
