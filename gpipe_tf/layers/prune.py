"""Cuts a function out of a traced graph between any of its tensors: the pieces of a shared layer trace and of a pipeline cell's program.

``Prune(wrapped, feeds, fetches)`` returns what TensorFlow's
``WrappedFunction.prune(feeds=feeds, fetches=fetches)`` returns (a
WrappedFunction taking `feeds` in order, returning `fetches`), built
another way:

* **One import, not an op at a time.** TensorFlow's prune copies each op in
  Python (lift_to_graph: a NodeDef read, a create_op and its shape
  inference an op); this imports the NodeDefs of the ops the fetches need
  with one ``import_graph_def``. A piece of the README's AmoebaNet cell took
  1.1 s to cut out that way.
* **Only what the fetches need.** lift_to_graph's topological walk goes on
  past the feeds and copies every ancestor of a fed tensor into the new
  graph as dead code (a W piece of a Transformer block held the block's
  whole forward: 588 ops where it needs 140), and a placeholder for every
  capture of the graph whether read or not. Here the function holds the
  fetches' ancestors through data and control inputs, stopping at the
  feeds and the captures, and captures only the variables it reads.

The ops are the same NodeDefs under the same names (colocation attributes
dropped, as lift_to_graph drops them; a control input on a fed tensor's op,
which would be a placeholder, dropped), the graph's functions are added to
the new graph, and feeds and captures become placeholders of their dtype,
shape and handle data. It raises what TensorFlow's prune raises where a
fetch needs what the feeds cannot replace (ERRORS): UnliftableError on a
placeholder that is neither fed nor captured, KeyError on another output of
a fed tensor's op.

``KeptWhole(function)`` is such a function that TensorFlow calls as it is
(neither inlined into its caller nor specialised per call site): a pipeline
cell calls its shared layer traces so (layers/shared_trace.py).

TensorFlow internals used (tests/layers/prune_test.py pins them): the
WrappedFunction class and its ``_variable_holder``, FuncGraph captures,
``importer.import_graph_def`` into a FuncGraph, resource handle data, and
the allow-list of function attributes (``attributes``).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import tensorflow as tf

# pylint: disable=g-direct-tensorflow-import
from tensorflow.core.framework import graph_pb2
from tensorflow.python.eager import wrap_function
from tensorflow.python.eager.polymorphic_function import attributes
from tensorflow.python.framework import func_graph
from tensorflow.python.framework import importer
from tensorflow.python.ops import op_selector
from tensorflow.python.ops import resource_variable_ops
# pylint: enable=g-direct-tensorflow-import

__all__ = ['ERRORS', 'KeptWhole', 'Prune']

# What Prune raises where a fetch depends on something the feeds cannot
# replace: a caller then cuts the graph another way (shared_trace: B makes
# the weight gradients; cell_program: the backward is not split).
ERRORS = (op_selector.UnliftableError, KeyError, ValueError)

_DROPPED_ATTRS = ('_class', '_tpu_replicate')

# The FunctionDef attributes of a function called whole: TensorFlow does not
# inline its calls (`_noinline`), and Grappler's function optimizer does not
# copy it for a call that passes a constant or leaves an output unused
# (`_nospecialize`; with it, 106 copies of one function in a 64-block step,
# each optimised on its own). tf.function's allow-list has the first only.
_KEPT_WHOLE = {'_noinline': True, '_nospecialize': True}
_ALLOWLIST_LOCK = threading.Lock()


def _Needed(fetches: Sequence[tf.Tensor], source_ops: set) -> set:
  """The ops the fetches need, stopping at the sources' ops."""
  needed, stack = set(), [x.op for x in fetches]
  while stack:
    op = stack.pop()
    if op in needed or op in source_ops:
      continue
    if op.type == 'Placeholder':
      raise op_selector.UnliftableError(
          f'{[x.name for x in fetches]} depend on the placeholder {op.name}, '
          'which is neither fed nor captured')
    needed.add(op)
    stack.extend(x.op for x in op.inputs)
    stack.extend(op.control_inputs)
  return needed


def _Placeholders(xs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
  """A placeholder standing for each of `xs` in the default graph: its
  dtype, shape, device and handle data (a variable's, a TensorList's
  element), made by one import: a placeholder op made from Python cost
  1.7-2.6x as much in an empty graph (0.24-0.36 ms against 0.14 ms), and a
  deep cell's pieces have thousands.

  Named `pruned_input_<i>`, not after x: a placeholder named `a/b/resource`
  would take the names `a` and `a/b`, and the import would rename the ops of
  those names it brings in (`a_1`, `a/b_1`), which errors name.
  """
  graph_def = graph_pb2.GraphDef()
  names = []
  for i, x in enumerate(xs):
    node = graph_def.node.add()
    node.name = f'pruned_input_{i}'
    node.op = 'Placeholder'
    node.device = x.op.device
    node.attr['dtype'].type = x.dtype.as_datatype_enum
    node.attr['shape'].shape.CopyFrom(x.shape.as_proto())
    names.append(node.name + ':0')
  out = importer.import_graph_def(graph_def, return_elements=names,
                                  name='') if names else []
  for x, y in zip(xs, out):
    handle = resource_variable_ops.get_resource_handle_data(x)
    if handle.shape_and_type:
      resource_variable_ops._set_handle_shapes_and_types(  # pylint: disable=protected-access
          y, handle, graph_mode=True)
  return out


def _GraphDef(graph: tf.Graph, needed: set, source_ops: set
              ) -> graph_pb2.GraphDef:
  """The NodeDefs of `needed`, in creation order, without colocation
  attributes or control inputs on source ops."""
  sources = {op.name for op in source_ops}
  graph_def = graph_pb2.GraphDef()
  graph_def.versions.CopyFrom(graph.graph_def_versions)
  for op in sorted(needed, key=lambda o: o._id):  # pylint: disable=protected-access
    node = graph_def.node.add()
    node.CopyFrom(op.node_def)
    for key in [k for k in node.attr if k.startswith(_DROPPED_ATTRS)]:
      del node.attr[key]
    if any(i.startswith('^') and i[1:] in sources for i in node.input):
      kept = [i for i in node.input
              if not (i.startswith('^') and i[1:] in sources)]
      del node.input[:]
      node.input.extend(kept)
  return graph_def


def Prune(wrapped: Any, feeds: Sequence[tf.Tensor],
          fetches: Sequence[tf.Tensor]) -> Any:
  """The function of `wrapped`'s graph (a tf.compat.v1.wrap_function) from
  the tensors `feeds` to the tensors `fetches` (module docstring).

  Feeds that are captures of the graph are dropped from the arguments, as
  TensorFlow's prune drops them; a fetch may be a feed or a capture.
  """
  # pylint: disable=protected-access
  graph = wrapped.graph
  captures = list(graph.captures)
  captured = {id(inner) for _, inner in captures}
  feeds = [x for x in feeds if id(x) not in captured]
  sources = {id(x): x for x in feeds}
  sources.update((id(inner), inner) for _, inner in captures)
  source_ops = {x.op for x in sources.values()}
  needed = _Needed(fetches, source_ops)
  # What the needed ops read of the sources' ops (the import's input map),
  # and the fetches that are sources themselves (passed through).
  consumed = {id(x): x for op in needed for x in op.inputs
              if x.op in source_ops}
  read = dict(consumed)
  read.update((id(x), x) for x in fetches if id(x) in sources)
  for x in read.values():
    if id(x) not in sources:
      raise KeyError(f'{x.name} is needed, and its op is fed: '
                     f'{[f.name for f in feeds]}')

  with graph.as_default():
    pruned = func_graph.FuncGraph('pruned')
  for f in graph._functions.values():
    pruned._add_function(f)
  with pruned.as_default():
    inputs = {id(x): x for x in
              feeds + [inner for _, inner in captures if id(inner) in read]}
    placeholders = dict(zip(inputs, _Placeholders(list(inputs.values()))))
    outputs = [x.name for x in fetches if id(x) not in sources]
    imported = iter(importer.import_graph_def(
        _GraphDef(graph, needed, source_ops),
        input_map={x.name: placeholders[id(x)] for x in consumed.values()},
        return_elements=outputs, name='') if outputs else ())
  pruned.outputs.extend(placeholders[id(x)] if id(x) in sources
                        else next(imported) for x in fetches)
  pruned.inputs.extend(placeholders[id(x)] for x in feeds)
  for outer, inner in captures:
    if id(inner) in placeholders:
      pruned.add_capture(outer, placeholders[id(inner)])
  pruned.variables = graph.variables
  pruned.structured_outputs = list(pruned.outputs)
  function = wrap_function.WrappedFunction(
      pruned, variable_holder=wrapped._variable_holder)
  function._num_positional_args = len(feeds)
  function._arg_keywords = [x.op.name for x in feeds]
  return function
  # pylint: enable=protected-access


def KeptWhole(function: Any) -> Any:
  """`function` (a Prune result) as a function TensorFlow calls whole:
  the same graph, under another name, with `_KEPT_WHOLE`'s attributes.
  Grappler, the placer and the executors then see its body once per
  device, however many calls a step makes, and each call runs it as a
  function of its own."""
  # pylint: disable=protected-access
  # One thread at a time (tf.distribute traces replicas in threads): two
  # interleaved swaps would leave the allow-list widened for good.
  with _ALLOWLIST_LOCK:
    allowed = attributes.MONOMORPHIC_FUNCTION_ALLOWLIST
    attributes.MONOMORPHIC_FUNCTION_ALLOWLIST = allowed | set(_KEPT_WHOLE)
    try:
      whole = wrap_function.WrappedFunction(
          function.graph, variable_holder=function._variable_holder,
          attrs=dict(_KEPT_WHOLE))
    finally:
      attributes.MONOMORPHIC_FUNCTION_ALLOWLIST = allowed
  whole._num_positional_args = function._num_positional_args
  whole._arg_keywords = function._arg_keywords
  return whole
  # pylint: enable=protected-access
