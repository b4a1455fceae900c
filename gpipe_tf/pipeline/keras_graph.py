"""The calls of a Keras functional model, nested functional models inlined, in an order that runs.

``Walk(model)`` lists every call of the model's graph (layer calls and
operation nodes such as ``x + y``) from its inputs to its outputs, each after
the calls it reads. A nested functional model (a keras_hub backbone inside a
task model, a Sequential block) is not one call: its own calls are listed in
its place, reading the tensors the outer call passed it (in any list or dict
structure). Tensors are named by ``Key``s, since the tensors inside a nested
model stand for different values at each of its calls.

A layer called at several places (tied embeddings, a shared block, a nested
model called twice) gives one call per place; each later call names its
first (``Call.first``), whose variables it reads.

A Keras tensor at several places of one call's outputs (a layer whose
``compute_output_spec`` repeats a spec) holds its last place's value, as in
Keras's functional run; the earlier places get Keys nothing reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import keras
from keras.src.models import functional  # pylint: disable=g-direct-keras-import

from gpipe_tf.layers import keras_layer
from gpipe_tf.layers import keras_shapes

__all__ = ['Call', 'Graph', 'Key', 'KerasModelError', 'Walk']


@dataclasses.dataclass(frozen=True)
class Key:
  """Names one tensor of a walk: the nested calls it lives in, then the id
  of its Keras tensor (a leaf to keras.tree, unlike a tuple)."""
  path: tuple


class KerasModelError(keras_layer.KerasLayerError):
  """A Keras model FromKeras cannot turn into a chain of layers."""


class Call(NamedTuple):
  """One call of a layer or operation.

  Attributes:
    operation: the Keras layer or Operation called.
    name: a name unique among the model's calls (the layer's name; later
      calls of a shared layer add '.call2', '.call3', ...).
    args, kwargs: the call's arguments, each Keras tensor replaced by a Key.
    outputs: the Keys of its outputs, flat.
    first: for a later call of a shared layer, the name of its first call.
    masks: the Key of each argument that carries a Keras mask -> the Key of
      its mask (Keras hands it to the layer: as ``mask``, as
      ``query_mask``/``value_mask``, or read off the tensor in ``call``).
  """
  operation: Any
  name: str
  args: Any
  kwargs: dict
  outputs: list
  first: str | None
  masks: dict


class Graph(NamedTuple):
  """A model's calls and ends.

  Attributes:
    inputs: the Keys of the model's inputs, in ``model.inputs`` order.
    input_names: their names (dict keys for a dict of inputs).
    dict_inputs: whether the model takes a dict.
    calls: the calls, each after those it reads.
    outputs: the model's output structure, each tensor a Key.
    tensors: Key -> its Keras tensor (shape, dtype).
  """
  inputs: list
  input_names: list
  dict_inputs: bool
  calls: list
  outputs: Any
  tensors: dict


def _Functional(op: Any) -> Any:
  """The functional graph a nested model call runs, or None for a layer."""
  if isinstance(op, keras.Sequential):
    return getattr(op, '_functional', None)
  return op if isinstance(op, functional.Functional) else None


def _Map(value: Any, fn: Callable[[Any], Any],
         leaf: type = keras.KerasTensor) -> Any:
  """`value` with each Keras tensor (each `leaf`) t in its lists, tuples and
  dicts fn(t)."""
  if isinstance(value, leaf):
    return fn(value)
  if isinstance(value, (list, tuple)):
    return type(value)(_Map(v, fn, leaf) for v in value)
  if isinstance(value, dict):
    return {k: _Map(v, fn, leaf) for k, v in value.items()}
  return value


def _Tensors(value: Any) -> list:
  out = []
  _Map(value, out.append)
  return out


def Walk(model: keras.Model) -> Graph:
  """The calls of `model` (module docstring).

  Raises:
    KerasModelError: not a functional model, or a nested model is called
      in a way that does not match its inputs.
    KerasInputShapeError: the model has no input shape.
  """
  graph = _Functional(model)
  if not isinstance(model, keras.Model) or (
      graph is None and not isinstance(model, keras.Sequential)):
    raise KerasModelError(
        f'FromKeras takes a keras.Sequential or functional keras.Model, got '
        f"{type(model).__name__} '{getattr(model, 'name', '')}': subclassed "
        'models have no graph; build them functionally (or wrap a single '
        'layer in keras.Sequential).')
  if graph is None or not graph.inputs or not graph.outputs:
    raise keras_layer.KerasInputShapeError(
        f"Keras model '{model.name}' has no input shape: start it with "
        'keras.Input(shape=...) or call model.build((None, ...)) first.')
  walker = _Walker()
  struct = graph._inputs_struct  # pylint: disable=protected-access
  inputs = list(graph.inputs)
  if isinstance(struct, dict):
    names = sorted(struct)  # keras.tree.flatten order.
    inputs = [struct[n] for n in names]
  else:
    names = [t.name for t in inputs]
  keys = [Key((id(t),)) for t in inputs]
  walker.tensors.update(zip(keys, inputs))
  outputs = walker.Expand(graph, (), {})
  return Graph(keys, names, isinstance(struct, dict), walker.calls, outputs,
               _Traced(walker.calls, walker.tensors))


def _Traced(calls: list, tensors: dict) -> dict:
  """`tensors` with the specs each call's `call` makes where Keras declared
  others (keras_shapes): a layer that defines its own shapes is traced, and
  so is every call reading a tensor whose spec changed."""
  tensors = dict(tensors)
  changed: set = set()
  for call in calls:
    reads = set()
    _Map((call.args, call.kwargs), reads.add, Key)
    if not (reads & changed or keras_shapes.OwnsShapes(call.operation)):
      continue
    args = _Map(call.args, tensors.get, Key)
    kwargs = _Map(call.kwargs, tensors.get, Key)
    declared = [tensors[k] for k in call.outputs]
    specs = keras_shapes.OutputSpecs(call.operation, args, kwargs, declared,
                                     trace=bool(reads & changed))
    for k, d, s in zip(call.outputs, declared, specs):
      if s is not d:
        tensors[k] = s
        changed.add(k)
  return tensors


class _Walker:
  """Lists the calls of a graph and of the graphs nested in it."""

  def __init__(self) -> None:
    self.calls: list[Call] = []
    self.tensors: dict = {}
    self._firsts: dict[int, str] = {}  # id(layer) -> name of its first call.
    self._counts: dict[int, int] = {}
    self._names: set[str] = set()

  def _Name(self, op: Any) -> tuple[str, str | None]:
    """(name of this call, name of the layer's first call or None)."""
    n = self._counts[id(op)] = self._counts.get(id(op), 0) + 1
    if n > 1 and isinstance(op, keras.layers.Layer):
      first = self._firsts[id(op)]
      return self._Unique(f'{first}.call{n}'), first
    name = self._Unique(op.name)
    self._firsts[id(op)] = name
    return name, None

  def _Unique(self, name: str) -> str:
    base, i = name, 1
    while name in self._names:
      i += 1
      name = f'{base}.{i}'
    self._names.add(name)
    return name

  def Expand(self, graph: Any, scope: tuple, alias: dict) -> Any:
    """Lists `graph`'s calls; returns its output structure as Keys.

    Args:
      graph: a functional model.
      scope: the nested calls it runs in (part of its tensors' Keys).
      alias: id of an input tensor of `graph` -> the Key it stands for.
    """

    def _Key(t):
      return alias.get(id(t), Key(scope + (id(t),)))

    for node in _Nodes(graph):
      op = node.operation
      inner = _Functional(op)
      if inner is not None:
        self._Nested(op, inner, node, scope, _Key, alias)
        continue
      name, first = self._Name(op)
      outs = _OutputKeys(node.outputs, _Key)
      self.tensors.update(zip(outs, node.outputs))
      masks = {_Key(t): _Key(_Mask(t)) for t in node.arguments.keras_tensors
               if _Mask(t) is not None}
      self.calls.append(Call(op, name, _Map(tuple(node.arguments.args), _Key),
                             _Map(dict(node.arguments.kwargs), _Key), outs,
                             first, masks))
    return _Map(graph._outputs_struct, _Key)  # pylint: disable=protected-access

  def _Nested(self, op: Any, inner: Any, node: Any, scope: tuple,
              key: Callable[[Any], Key], alias: dict) -> None:
    """Inlines the call of nested model `op` (graph `inner`) at `node`."""
    given = _Tensors(node.arguments.args)
    masked = [t.name for t in given if _Mask(t) is not None]
    if masked:
      raise KerasModelError(
          f"nested model '{op.name}' is called on {masked}, which carry Keras "
          'masks; the layers inside it were built without them: pass the '
          'mask as an input of the nested model (as keras_hub backbones take '
          'padding_mask), or build the model flat.')
    wanted = keras.tree.flatten(inner._inputs_struct)  # pylint: disable=protected-access
    extra = [k for k, v in node.arguments.kwargs.items()
             if _Tensors(v) and k != 'training']
    if len(given) != len(wanted) or extra:
      raise KerasModelError(
          f"nested model '{op.name}' takes {len(wanted)} input tensors but "
          f'is called with {len(given)} (and tensor keywords {extra}): call '
          'it with its inputs in the structure it was built on.')
    if isinstance(node.arguments.args[0], dict) and len(
        node.arguments.args) == 1 and isinstance(
            inner._inputs_struct, dict):  # pylint: disable=protected-access
      # Matched by key, as Keras matches a dict.
      given = [node.arguments.args[0][k] for k in sorted(
          inner._inputs_struct)]  # pylint: disable=protected-access
      wanted = [inner._inputs_struct[k] for k in sorted(  # pylint: disable=protected-access
          inner._inputs_struct)]  # pylint: disable=protected-access
    sub_scope = scope + (id(node),)
    outs = keras.tree.flatten(self.Expand(
        inner, sub_scope, {id(w): key(g) for w, g in zip(wanted, given)}))
    for t, k in zip(node.outputs, outs):
      alias[id(t)] = k


def _OutputKeys(outputs: list, key: Callable[[Any], Key]) -> list:
  """The Keys of a call's flat outputs.

  A Keras tensor may stand at several places of them: a layer whose
  compute_output_spec returns one spec for several outputs (keras_hub's
  DFineDecoder gives every decoder layer's attention weights the same
  one). Keras's functional run sets each output tensor's value in turn,
  so the tensor holds its last place's value, and every reader (the
  model's outputs too) gets that. So here: the last place gets the
  tensor's Key, each earlier place a Key of its own that nothing reads.
  """
  last = {id(t): j for j, t in enumerate(outputs)}
  return [key(t) if last[id(t)] == j else
          Key(key(t).path + (('overwritten', j),))
          for j, t in enumerate(outputs)]


def _Nodes(graph: Any) -> list:
  """The call nodes of functional `graph` from its inputs to its outputs,
  each after the nodes it reads (input layers left out)."""
  is_input = {id(t) for t in graph.inputs}
  order, done = [], set()
  stack = [(t, False) for t in reversed(graph.outputs)]
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
      if not isinstance(op, keras.layers.InputLayer):
        order.append(node)
      continue
    stack.append((tensor, True))
    # A Keras mask an argument carries is read too (Call.masks).
    reads = list(node.arguments.keras_tensors)
    reads += [_Mask(t) for t in reads if _Mask(t) is not None]
    stack.extend((t, False) for t in reversed(reads) if id(t) not in is_input)
  return order


def _Mask(tensor: Any) -> Any:
  """The Keras mask a Keras tensor carries (a Keras tensor), or None."""
  return getattr(tensor, '_keras_mask', None)
