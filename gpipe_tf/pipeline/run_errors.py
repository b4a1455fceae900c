"""Says where in the schedule an op failed as a pipelined step ran: the action, its tick and device.

An op that fails when a ``tf.function`` runs (a ``check_numerics`` or
``tf.debugging.assert_*`` in a layer, a gather out of range, a shape known
only at run time) comes back from TensorFlow as a ``tf.errors.OpError``
whose message names the op the way it was traced, measured on TF 2.21::

    {{function_node __inference_pruned_606}} a NaN : Tensor had NaN values
      [[{{function_node __inference_pruned_606}}{{node CheckNumerics}}]]

that is, the op's name inside the innermost function that holds it, and that
function's name, but none of the call ops on the way to it: not the piece's
call (``stage1_FB_mb2/StatefulPartitionedCall``, under its step's scope),
nor a loop's or a branch's op (TensorFlow leaves the calling nodes out on
purpose: an error already naming a node gets no other). When the step's
``tf.function`` has a name its parser reads (``train_step``, not a lambda),
TensorFlow rewrites the message and drops the function's name too, leaving
``[[{{node CheckNumerics}}]]``. So:

* an op the engine builds itself (a slot's read or write, a receipt) names
  its step by its name scope, also inside a loop's body or a switch branch
  (``while/stage1_FB_t7/TensorArrayV2Read``; ``ticks.Scope``,
  ``ticks.ReceiptScope``);
* an op of a layer is inside a piece's function (or one it calls), which
  every action running that piece calls: found by the function's name, or
  by the op's name among the ops of each piece's functions when TensorFlow
  dropped it (an op name two pieces share names both), the stage and kind
  are known, the micro-batch is not, and the error says so, naming every
  action it may have been (``ticks.Among``).

``Explain(error, *modules)`` turns such an error into one of the same type
(``except tf.errors.InvalidArgumentError`` still catches it) whose message
starts with the place, the original error its ``__cause__`` and the place
(a ``ticks.StepError``: ``action``, ``actions``, ``tick``, ``device``) its
``where``::

    InvalidArgumentError in one of 4 actions, FB of stage 1 on micro-batch
    0, 1, 2 or 3 at tick 1, 2, 4 or 6 on device 1 (...):
    dev 1: ..   !FB0 !FB1 ..   !FB2 ..   !FB3
    {{function_node ...}} a NaN : Tensor had NaN values ...

``Explaining(*modules, training=)`` raises it around any code (the
trainer's steps and PipelineModel's fit and evaluate run inside one;
``training`` says which of a layer's steps may have failed). It reads the steps the
PipeliningLayers in `modules` built last (``Cell.compiled``): a step built
over a data-parallel replica's cells (``PipeliningLayer._ReplicaCells``) is
not among them, and its errors go on as TensorFlow raised them.

Reads what the engine built and builds nothing: not part of the engine's
TensorFlow half (tools.code_lines).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Sequence

import tensorflow as tf

from gpipe_tf.pipeline.pipelining_layer import PipeliningLayer
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import ticks

__all__ = ['Explain', 'Explaining', 'Locations']

# Where an OpError's message says an op failed: the op's name inside the
# function that holds it ({{function_node f}}{{node n}}), or in the top
# graph ({{node n}}).
_LOCATION = re.compile(
    r'\[\[(?:\{\{function_node ([^}]+)\}\})?\{\{node ([^}]+)\}\}')


def Locations(message: str) -> list[tuple[str | None, str]]:
  """(the function holding it or None, the op's name) of every op an
  OpError's message says failed, in its order (its first root error
  first)."""
  return [(f or None, n) for f, n in _LOCATION.findall(message or '')]


def _Pipelines(modules: Sequence[Any]) -> list:
  """The PipeliningLayers among `modules` and their submodules."""
  found = []
  for m in modules:
    inside = [m] + list(m.submodules if isinstance(m, tf.Module) else ())
    found += [x for x in inside if isinstance(x, PipeliningLayer)
              and x not in found]
  return found


def _Served(plan: Sequence[periods.Segment], column: int) -> list[int]:
  """The ticks the code built at `column` runs: those of a loop's
  iterations when the column is in its body, else the column's own."""
  for seg in plan:
    if seg.kind == periods.REPEAT and (
        seg.start <= column < seg.start + seg.period):
      return [column + i * seg.period for i in range(seg.repeats)]
  return [column]


def _Contents(piece: Any) -> tuple[set[str], set[str]]:
  """(the names of a piece's function and of every function it calls, the
  names of the ops of any of them)."""
  function = piece.function
  graph = getattr(function, 'graph', None)
  if graph is None:  # No piece, or one XLA compiles (traced per call).
    return set(), set()
  name = function.name
  names = {name.decode() if isinstance(name, bytes) else name}
  ops, graphs = set(), [graph]
  while graphs:
    inner = graphs.pop()
    ops.update(op.name for op in inner.get_operations())
    for name, called in inner._functions.items():  # pylint: disable=protected-access
      if name not in names and getattr(called, 'graph', None) is not None:
        names.add(name)
        graphs.append(called.graph)
  return names, ops


def _Actions(compiled: Any, i: int, function: str | None,
             node: str) -> tuple[list, int | None]:
  """(the actions of compiled.ticks[i] the failing op may belong to, the
  receiving stage when it is a receipt)."""
  program, plan = compiled.ticks[i], compiled.plans[i]
  found = ticks.FindScope(node)
  if found is not None:
    stage, kind, micro_batch, column = found
    at = (range(program.num_ticks) if column is None else
          _Served(plan, column))
    if kind == ticks.RECV:
      return ticks.Senders(program, stage, at), stage
    return [a for a, t in program.tick.items()
            if (a.stage, a.kind) == (stage, kind) and
            micro_batch in (None, a.micro_batch) and
            (micro_batch is not None or t in at)], None
  acts, contents = [], {}
  for d, (row, steps) in enumerate(zip(program.grid, program.steps)):
    for t, act in enumerate(row):
      if act is not None:
        # Built when the step was (interpreter._Plan): read, not pruned.
        piece = compiled.programs[act.stage].Piece(
            steps[program.branch[d][t] - 1])
        if id(piece) not in contents:
          contents[id(piece)] = _Contents(piece)
        names, ops = contents[id(piece)]
        if function in names if function else node in ops:
          acts.append(act)
  return acts, None


def Explain(error: tf.errors.OpError, *modules: Any,
            training: bool | None = None) -> tf.errors.OpError | None:
  """`error`, raised by an op as a step of a PipeliningLayer in `modules`
  (or in their submodules) ran, explained (module docstring): an error of
  its type whose message starts with the action, tick and device and the
  device's row of the tick program with the action marked, its ``where``
  the ticks.StepError saying so; None when the error names no op of such a
  step (or is explained already).

  Args:
    error: what the step raised.
    *modules: PipeliningLayers, or modules holding them (a task, a model).
    training: whether the failing step was a training step (True) or an
      inference one (False); None: either. A layer's op that a training and
      an evaluation step both run, named without its function (module
      docstring), is otherwise put in the step built last.
  """
  if getattr(error, 'where', None) is not None:
    return None
  for function, node in Locations(error.message):
    for layer in _Pipelines(modules):
      for compiled in layer.cells[0].compiled:
        if training not in (None, compiled.programs[0].training):
          continue
        for i, program in enumerate(compiled.ticks):
          acts, receiver = _Actions(compiled, i, function, node)
          if not acts:
            continue
          where = ticks.Among(program, acts)
          if receiver is not None:
            where = ticks.StepError(
                f'stage {receiver} taking in what was made by {where}').At(
                    where.action, where.tick, where.device)
            where.actions = tuple(acts)
          whole = isinstance(error, tf.errors.CancelledError) and any(
              compiled.programs[a.stage].calls_whole for a in acts)
          return ticks.Explained(error, where, _WHOLE if whole else '')
  return None


# Said of a cancelled action whose stage calls pieces whole: TensorFlow
# reports an op failing inside a function called whole, beside other calls
# on its device, as the cancellation of what waited for it
# (docs/tensorflow-notes.md).
_WHOLE = (
    '\nThis stage calls its pieces whole (PipeliningLayer '
    'whole_piece_min_flops): an op failing inside one may be reported as '
    "this cancellation, its own error only in TensorFlow's log. Set "
    'whole_piece_min_flops=None to see that error here.')


@contextlib.contextmanager
def Explaining(*modules: Any, training: bool | None = None
               ) -> Iterator[None]:
  """Runs the code inside; an OpError it raises that Explain explains for
  `modules` (and `training`, as Explain takes it) is raised as that error
  (from the original), any other goes on as it is."""
  try:
    yield
  except tf.errors.OpError as e:
    explained = Explain(e, *modules, training=training)
    if explained is None:
      raise
    raise explained from e
