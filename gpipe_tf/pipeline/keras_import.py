"""FromKeras: a Keras Sequential or functional model as the list of layer Params a pipeline takes, and its weights.

``FromKeras(model)`` walks the model's graph in topological order and gives
one ``KerasLayer`` Params per Keras layer call. A functional model whose
layers branch and merge (residual blocks) becomes a chain by carrying every
tensor that a later layer still needs as a tuple: each layer reads its
arguments from the tuple it gets and returns its outputs followed by the
tensors still live (``KerasLayer`` ``inputs`` / ``passthrough``). For a
pre-norm residual block::

    keras graph                       chain of Params (tuple after each)
    x -> LayerNorm -> h               ln:   (x,)   -> (h, x)
    h -> MultiHeadAttention(h, h) -> a  mha: (h, x) -> (a, x)
    Add()([x, a]) -> y                add:  (a, x) -> (y,)

The cut between two pipeline cells then passes the whole tuple.
``LoadKerasWeights(layer, model)`` copies the model's weights into a built
SequentialLayer or PipeliningLayer (or any tf.Module holding KerasLayers)
over those Params.

This module deliberately does NOT convert a model whose layer is called at
more than one place (shared weights cannot live in two cells), a model with
operations that are not layers (``x + y`` on Keras tensors: use
``keras.layers.Add``), or several outputs; it raises KerasModelError saying
what to change.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import keras_layer

__all__ = ['FromKeras', 'KerasModelError', 'LoadKerasWeights']

_LITERALS = (type(None), bool, int, float, str)


class KerasModelError(keras_layer.KerasLayerError):
  """A Keras model FromKeras cannot turn into a chain of layers."""


def FromKeras(model: keras.Model) -> list[hyperparams.InstantiableParams]:
  """The KerasLayer Params of each layer call of `model`, in an order that runs.

  Feed the result to ``SequentialLayer`` or ``PipeliningLayer`` Params
  ``layers`` (with ``input_shapes=params[0].input_shapes`` for the cost
  estimate), build it, then ``LoadKerasWeights`` to start from the model's
  weights. The Params are named after the Keras layers.

  Args:
    model: a built ``keras.Sequential`` or functional ``keras.Model`` (from
      ``keras.Input``) with one output.

  Raises:
    KerasInputShapeError: the model has no input shape yet.
    KerasModelError: the model is not a chain of distinct layers (see the
      module docstring).
    UnknownKerasClassError, UnsupportedKerasLayerError: a layer cannot be
      declared or run exactly (keras_layer).
  """
  inputs, outputs = _Ends(model)
  nodes = _TopologicalNodes(model, inputs, outputs)
  last_use = {}
  for i, node in enumerate(nodes):
    for t in node.arguments.keras_tensors:
      last_use[id(t)] = i
  for t in outputs:
    last_use[id(t)] = len(nodes)
  live = list(inputs)
  params = []
  for i, node in enumerate(nodes):
    layer = node.operation
    index = {id(t): j for j, t in enumerate(live)}
    keep = [t for t in live if last_use.get(id(t), -1) > i]
    args, input_kwargs, call_kwargs = _Arguments(model, node, index)
    if any(getattr(t, '_keras_mask', None) is not None for t in node.outputs):
      raise KerasModelError(
          f"Keras model '{model.name}': layer '{layer.name}' makes a Keras "
          'mask (mask_zero, Masking), which a pipeline does not carry. Pass '
          'the mask (or paddings) as an input tensor of the layers that use '
          'it, or drop mask_zero.')
    config = {k: v for k, v in layer.get_config().items() if k != 'name'}
    _CheckLiteral(layer.name, config, 'config')
    params.append(keras_layer.KerasLayer.Params().Set(
        name=layer.name, keras_class=keras_layer.KerasClassPath(type(layer)),
        config=config, input_shapes=[tuple(t.shape) for t in live],
        inputs=args, input_kwargs=input_kwargs, call_kwargs=call_kwargs,
        passthrough=[index[id(t)] for t in keep]))
    live = list(node.outputs) + keep
  if [id(t) for t in live] != [id(t) for t in outputs]:
    raise KerasModelError(
        f"Keras model '{model.name}': its output must be what its last layer "
        'returns; return that tensor (an input passed straight out is not a '
        'layer).')
  return params


def LoadKerasWeights(layer: tf.Module, model: keras.Model
                     ) -> list[tuple[Any, tf.Variable]]:
  """Copies `model`'s weights into the KerasLayers of built `layer`.

  Each KerasLayer takes the weights of the model's layer of the same name
  (FromKeras names the Params after the Keras layers).

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
  by_name = {l.name: l for l in _Layers(model)}
  found = [m for m in (layer,) + tuple(layer.submodules)
           if isinstance(m, keras_layer.KerasLayer)]
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


def _Ends(model: keras.Model) -> tuple[list, list]:
  """The model's input and output Keras tensors."""
  if not isinstance(model, keras.Model):
    raise KerasModelError(
        f'FromKeras takes a keras.Sequential or functional keras.Model, got '
        f'{type(model).__name__}; wrap a single layer in keras.Sequential.')
  try:
    inputs, outputs = list(model.inputs), list(model.outputs)
  except (AttributeError, ValueError):
    inputs = outputs = None
  if not inputs or not outputs:
    raise keras_layer.KerasInputShapeError(
        f"Keras model '{model.name}' has no input shape: start it with "
        'keras.Input(shape=...) or call model.build((None, ...)) first. '
        'Subclassed models have no graph; build them functionally.')
  if len(outputs) != 1:
    raise KerasModelError(
        f"Keras model '{model.name}' has {len(outputs)} outputs; a pipeline "
        'returns its last layer\'s outputs: concatenate them in a last layer '
        'or import one output per model.')
  return inputs, outputs


def _TopologicalNodes(model: keras.Model, inputs: list, outputs: list
                      ) -> list:
  """The call nodes from `inputs` to `outputs`, each after its arguments."""
  is_input = {id(t) for t in inputs}
  order, done, calls = [], set(), {}
  stack = [(t, False) for t in reversed(outputs)]
  while stack:
    tensor, expanded = stack.pop()
    if id(tensor) in is_input:
      continue
    # The call that made a Keras tensor, as Keras's own graph walk finds it.
    op, node_index, _ = tensor._keras_history  # pylint: disable=protected-access
    node = op._inbound_nodes[node_index]  # pylint: disable=protected-access
    if id(node) in done:
      continue
    if expanded:
      done.add(id(node))
      order.append(node)
      continue
    stack.append((tensor, True))
    stack.extend((t, False) for t in reversed(node.arguments.keras_tensors)
                 if id(t) not in is_input)
  for node in order:
    op = node.operation
    if not isinstance(op, keras.layers.Layer) or isinstance(
        op, keras.layers.InputLayer):
      raise KerasModelError(
          f"Keras model '{model.name}': '{op.name}' ({type(op).__name__}) is "
          'an operation, not a layer. Write it as a layer: keras.layers.Add '
          '/ Multiply / Concatenate / Activation instead of x + y, x * y, '
          'keras.ops....')
    calls[id(op)] = calls.get(id(op), 0) + 1
    if calls[id(op)] > 1:
      raise KerasModelError(
          f"Keras model '{model.name}' is not a chain of layers: layer "
          f"'{op.name}' is called at {calls[id(op)]} places (shared "
          'weights). Give each call its own layer.')
  return order


def _Arguments(model: keras.Model, node: Any, index: dict
               ) -> tuple[list, dict, dict]:
  """(inputs, input_kwargs, call_kwargs) of a KerasLayer for a call node."""
  name = node.operation.name

  def _Index(value, where):
    if isinstance(value, keras.KerasTensor):
      return index[id(value)]
    if isinstance(value, (list, tuple)) and value and all(
        isinstance(v, keras.KerasTensor) for v in value):
      return [index[id(v)] for v in value]
    raise KerasModelError(
        f"Keras model '{model.name}': layer '{name}' takes {where} "
        f'{value!r}; a pipeline layer takes tensors (or one list of them) '
        'as positional arguments: pass constants by keyword or in the '
        "layer's config.")

  args = [_Index(a, 'positional argument') for a in node.arguments.args]
  tensors, constants = {}, {}
  for key, value in node.arguments.kwargs.items():
    if key == 'training' or (key == 'mask' and value is None):
      continue  # The pipeline passes training; Keras adds mask=None.
    if key == 'mask':
      raise KerasModelError(
          f"Keras model '{model.name}': layer '{name}' takes a mask; a "
          'pipeline does not carry Keras masks. Pass the mask as an input '
          'tensor of a layer that applies it.')
    if isinstance(value, keras.KerasTensor):
      tensors[key] = index[id(value)]
    else:
      _CheckLiteral(name, value, f'keyword argument {key}')
      constants[key] = value
  return args, tensors, constants


def _CheckLiteral(name: str, value: Any, where: str) -> None:
  """Raises unless `value` is built of literals Params can write as text."""
  if isinstance(value, dict):
    for k, v in value.items():
      _CheckLiteral(name, k, where)
      _CheckLiteral(name, v, where)
  elif isinstance(value, (list, tuple)):
    for v in value:
      _CheckLiteral(name, v, where)
  elif not isinstance(value, _LITERALS):
    raise keras_layer.UnsupportedKerasLayerError(
        f"Keras layer '{name}': its {where} holds a {type(value).__name__}, "
        'which Params cannot hold as text; give the layer a config of '
        'literals (register custom objects and serialise them by name).')


def _Layers(model: keras.Model) -> list:
  return [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
