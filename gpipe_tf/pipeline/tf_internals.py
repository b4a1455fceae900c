"""The TensorFlow internals the engine relies on, in one place: graph surgery, loop control edges, TensorList ops.

Each of these is a private or graph-mode (tf.compat.v1) API that a
TensorFlow upgrade may change or drop. tests/pipeline/tf_internals_test.py
pins the behaviour the engine relies on, one test per function, so that an
upgrade fails there first, with the API named, rather than as a wrong
gradient or a memory bound that no longer holds somewhere in a step.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence
import weakref

import numpy as np
import tensorflow as tf


__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.

def WrapFunction(fn: Callable[..., Any],
                 signature: Sequence[tf.TensorSpec]) -> Any:
  """`fn` traced once into a graph of its own (tf.compat.v1.wrap_function):
  a WrappedFunction that layers/prune.py's Prune cuts functions out of
  between any of its tensors, and whose `.structured_outputs` keeps the
  None leaves of what `fn` returned."""
  return tf.compat.v1.wrap_function(fn, list(signature))


def ReplaceInput(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
  """Makes input `index` of `op` read `tensor` (Operation._update_input):
  an edit of a graph already built, which no public API offers."""
  op._update_input(index, tensor)  # pylint: disable=protected-access


@contextlib.contextmanager
def NoAutomaticControlDependencies(graph: tf.Graph):
  """Loops and conds built in here get no automatic control dependencies.

  while_v2 and cond_v2 build their bodies with them when the graph they are
  built in has them (a tf.function's graph does), reading the graph's
  private ``_add_control_dependencies``; a graph without it is left alone.
  """
  name = '_add_control_dependencies'
  if not hasattr(graph, name):
    yield
    return
  saved = getattr(graph, name)
  setattr(graph, name, False)
  try:
    yield
  finally:
    setattr(graph, name, saved)


def ShapeUnknown(x: tf.Tensor, shape: Sequence[Any]) -> tf.Tensor:
  """`x` with the static shape `shape` (less specific than its own), e.g.
  a loop variable's or a carry's (tf.compat.v1.placeholder_with_default:
  tf.ensure_shape can only make a shape more specific)."""
  return tf.compat.v1.placeholder_with_default(x, list(shape))


def MarkUsed(value: Any) -> Any:
  """Marks a TensorArray a tf.function made as used, and returns it.

  TensorArray methods wrap what they return in tf_should_use, which logs
  an 'Object was never used' error, with a stack trace, when the wrapper is
  collected unread. The engine makes a TensorArray per slot per step and
  keeps only the last of each chain; the ones it drops are superseded, not
  forgotten, so their wrappers are marked (reading any attribute does it).
  """
  mark = getattr(value, 'mark_used', None)  # Reading it marks already.
  if mark is not None:
    mark()
  return value


# Per graph, the constants Const made in it: {key: tensor}.
_CONSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def Const(value: Any, dtype: tf.DType) -> tf.Tensor:
  """tf.constant(value, dtype), made once per graph, device scope and
  colocation scope, and shared by every op that asks for it there.

  The engine's slot reads and writes each need small constants (an index,
  an element shape, an empty tensor): a new one each would be thousands of
  ops per step, each costing about a millisecond of Python to build (more
  than the op that reads it), then Grappler's and the executor's time. A
  shared one is made with no control dependencies (a constant waits for
  nothing; the op that reads it still waits for its own). Eagerly, or in a
  graph whose device and colocation stacks (private) cannot be read, a new
  constant.
  """
  if tf.executing_eagerly():
    return tf.constant(value, dtype)
  graph = tf.compat.v1.get_default_graph()
  try:
    scope = (tuple(graph._device_function_stack.peek_objs()),  # pylint: disable=protected-access
             tuple(graph._colocation_stack.peek_objs()))  # pylint: disable=protected-access
    hash(scope)
  except (AttributeError, TypeError):
    return tf.constant(value, dtype)
  array = np.asarray(value, dtype.as_numpy_dtype)
  key = (scope, dtype, array.shape, array.tobytes())
  consts = _CONSTS.setdefault(graph, {})
  const = consts.get(key)
  if const is None:
    with graph.control_dependencies(None):
      const = consts[key] = tf.constant(array, dtype)
  return const


def Index(m: Any) -> Any:
  """A slot index as a tensor: Const for a Python int, else m itself."""
  return Const(m, tf.int32) if isinstance(m, int) else m


def ListReserve(dtype: tf.DType, num_elements: int) -> tf.Tensor:
  """An empty TensorList of `num_elements` items of any shape."""
  return tf.raw_ops.TensorListReserve(
      element_shape=Const(-1, tf.int32), num_elements=num_elements,
      element_dtype=dtype)


def ListGetItem(handle: tf.Tensor, index: Any, spec: tf.TensorSpec
                ) -> tf.Tensor:
  """Item `index` of a TensorList, with `spec`'s static shape. Reading an
  item copies no data: the list holds references."""
  shape = spec.shape
  value = tf.raw_ops.TensorListGetItem(
      input_handle=handle, index=Index(index),
      element_shape=Const(
          -1 if shape.rank is None else
          [-1 if d is None else d for d in shape.as_list()], tf.int32),
      element_dtype=spec.dtype)
  value.set_shape(shape)
  return value


def ListSetItem(handle: tf.Tensor, index: Any, item: tf.Tensor) -> tf.Tensor:
  """The TensorList with item `index` set to `item` (the item it held is
  released once no other list version holds it)."""
  return tf.raw_ops.TensorListSetItem(input_handle=handle, index=Index(index),
                                      item=item)
