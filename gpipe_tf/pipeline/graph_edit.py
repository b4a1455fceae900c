"""Reads and edits a cell step's traced graph: the ops tensors depend on, reads of trainable variables, and late weight casts.

cell_program.py traces a cell's whole step for one micro-batch into one
graph and cuts it into pieces; these helpers find which backward ops each
piece needs (``Ancestors``) and, under a 16-bit policy, move each weight's
cast in the backward to when its gradient arrives (``CastsJustInTime``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf.pipeline import tf_internals

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


def Ancestors(tensors: Sequence[Any], within: set) -> set:
  """The ops of `within` that `tensors` depend on (data or control edges)."""
  seen, stack = set(), [t.op for t in tensors if t is not None]
  while stack:
    op = stack.pop()
    if op in seen or op not in within:
      continue
    seen.add(op)
    stack.extend([i.op for i in op.inputs] + list(op.control_inputs))
  return seen


def TrainableReads(graph: tf.Graph, variables: Sequence[tf.Variable]):
  """A predicate: whether a tensor of `graph` is a read of one of
  `variables`, or a cast of one (a 16-bit read of a float32 master)."""
  trainable = {id(v.handle) for v in variables}
  captured = {id(internal): external
              for external, internal in graph.captures}

  def _Reads(x: tf.Tensor) -> bool:
    if x.op.type == 'Cast':
      x = x.op.inputs[0]
    return (x.op.type == 'ReadVariableOp' and
            id(captured.get(id(x.op.inputs[0]))) in trainable)
  return _Reads


def CastsJustInTime(graph: tf.Graph, backward: Sequence[tf.Operation],
                     reads_trainable: Callable[[tf.Tensor], bool]) -> None:
  """Gives each backward op that reads a cast of a trainable variable (the
  16-bit weights under a mixed policy) a cast of its own, made once the
  op's other backward inputs exist (the gradient arriving at its layer).
  Only backward ops are waited on: a control edge to a forward op would
  pull that op into pieces that are fed its output instead.

  The forward's cast depends on nothing but the variable, so a piece that
  runs the backward would compute every layer's cast as it starts and keep
  them all until the backward reaches each layer: in bfloat16 that is a
  cell's weights over again, held beside the activations at the step's
  peak. A cast that waits for the gradient arriving at its layer lives
  only as long as that layer's backward. (Forward ops read their casts in
  order, so the forward's casts are left as they are.)
  """
  later = set(backward)
  for op in backward:
    for i, x in enumerate(list(op.inputs)):
      if x.op.type != 'Cast' or x.op in later or not reads_trainable(x):
        continue
      after = [y.op for j, y in enumerate(op.inputs)
               if j != i and y.op in later]
      if not after:
        continue
      with graph.as_default(), tf.control_dependencies(after):
        late = tf.cast(x.op.inputs[0], x.dtype, name='late_cast')
      tf_internals.ReplaceInput(op, i, late)
