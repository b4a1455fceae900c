"""What tools read from the engine: a cell's traced program and its tensors, an action's op names, the memory model's sizes.

The engine's modules (cell_program, tick_graph, slots, ...) are internal; a
tool that measures, plans or explains a pipelined step reads them through
these names only (docs/pipeline.md, "What tools read from a step"):

* **A program's pieces and their tensors.** ``TraceCell`` traces one cell's
  training step as the engine traces a stage (a ``Program``: ``tensors``,
  one micro-batch's traced tensors by role (``roles.Role``);
  ``variables``; ``Piece(step)``, the pruned piece of a
  ``schedule.ticks.Step``, called on ``roles.Tensors`` and returning the
  roles of its ``makes``). ``TrainingPrograms`` gives the programs a
  PipeliningLayer's cells traced for a training step.
* **Per-action op names.** Every op a step builds is under its action's name
  scope (``schedule.ticks.Scope``: ``stage1_FB_mb2`` built at its tick,
  ``stage1_FB_t7`` in a loop's body, ``stage1_FB`` in a switch branch);
  ``FindActionScope`` reads the first one out of an op's name.
* **Memory model inputs.** ``ProgramBytes`` and ``TracedStageBytes`` turn
  traced programs into ``schedule.memory.StageBytes``: what a stage holds per
  micro-batch, for ``schedule.memory``'s profile::

    input        the stage's flat inputs and the skips it pops   (x, skip_in)
    activations  what a kept forward stashes, less its inputs    (saved)
    wcut         what a B stashes for its W                      (wcut)
    pinned       what a recomputing backward is fed              (pinned)
    gradients    the weight-gradient sums                        (dws)
    weights      the variables the stage reads

  Each buffer counts once: a stashed tensor that is a view of another (a
  Reshape's output shares its input's buffer) adds nothing.

This module reads what the engine built and builds nothing of its own: it is
not part of the engine's TensorFlow half (tools.code_lines).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, Sequence

from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import memory as memory_lib
from gpipe_tf.pipeline.schedule import ticks

__all__ = ['ActionScope', 'FindActionScope', 'Program', 'ProgramBytes',
           'TraceCell', 'TracedStageBytes', 'TrainingPrograms']


class Program(Protocol):
  """A cell's traced program, as tools read it (cell_program.CellProgram)."""
  training: bool
  variables: Sequence[Any]
  tensors: roles.Tensors

  def Piece(self, step: Any) -> Any:
    """The pruned piece of a schedule.ticks.Step: piece(roles.Tensors) ->
    roles.Tensors of the roles in its ``makes``."""


def TraceCell(layers: Sequence[Any], in_specs: Sequence[Any],
              device: str = '/device:CPU:0', *,
              skip_in: Sequence[str] = (), skip_out: Sequence[str] = (),
              skip_specs: Sequence[Any] = (),
              defers_w: bool = True) -> Program:
  """One cell's training step over `layers` (instantiated), traced and
  pruned as the engine traces a stage's, on one micro-batch of `in_specs`
  (tf.TensorSpec, flat).

  Args:
    layers: the cell's layers, in order.
    in_specs: its flat input specs.
    device: the device its ops run on.
    skip_in: the names of the skips it pops (layers/skips.py), in the order
      its forward takes them; their specs are `skip_specs`.
    skip_out: the names of the skips it stashes for later cells.
    skip_specs: one micro-batch's specs of the skips it pops.
    defers_w: whether its backward is cut into B and W.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import cell as cell_lib  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import cell_program  # pylint: disable=g-import-not-at-top
  cell = cell_lib.Cell(0, list(layers), device, skip_in=skip_in,
                       skip_out=skip_out)
  return cell_program.CellProgram(
      cell, tuple(in_specs), list(in_specs), tf.TensorSpec([2], tf.int64),
      True, defers_w=defers_w, skip_specs=skip_specs)


def TrainingPrograms(cells: Sequence[Any]) -> list[Program] | None:
  """Per cell of a PipeliningLayer (its ``cells``), the one training program
  it traced; None when a cell has traced none, or several (which one is
  meant would be a guess)."""
  out = []
  for cell in cells:
    programs = [p for p in cell.programs.values() if p.training]
    if len(programs) != 1:
      return None
    out.append(programs[0])
  return out


def _Buffer(x: Any) -> tuple:
  """A key of the buffer `x` is a view of (its own if none). Views are
  followed into the calls of shared layer traces (layers/shared_trace.py)
  too: a call's output is its function's, often a view of one of the call's
  inputs or of another output (a block's saved tensors): counted on its
  own, three Transformer blocks kept 1.36x the activations and 1.55x the W
  inputs they keep traced layer by layer."""
  from gpipe_tf.layers import shared_trace  # pylint: disable=g-import-not-at-top
  views = shared_trace.VIEW_OPS
  calls = []  # (a call entered, its function's graph), innermost last.
  while True:
    if x.op.type in views:
      x = shared_trace.ViewedTensor(x)
      continue
    graph = shared_trace.CalledGraph(x.op)
    if graph is not None:
      calls.append((x.op, graph))
      x = graph.outputs[x.value_index]
      continue
    if calls and x.op.type == 'Placeholder':
      op, graph = calls[-1]
      i = next((i for i, t in enumerate(graph.inputs) if t is x), None)
      if i is not None:  # The call's input: its caller's tensor.
        calls.pop()
        x = op.inputs[i]
        continue
    return tuple(id(op) for op, _ in calls) + (id(x),)


def _Bytes(tensors: Sequence[Any], exclude: frozenset = frozenset()
           ) -> int | None:
  """Bytes of one micro-batch's tensors, each buffer once (views of one
  buffer, None leaves and tensors whose buffer is in `exclude` count 0);
  None when a shape is not known statically. An integer vector of unknown
  length in a step traced on static shapes is shape arithmetic (the axes a
  broadcast's gradient sums over, say) and counts 0."""
  total, seen = 0, set(exclude)
  tensors = list(tensors)
  for x in tensors:
    if x is None:
      continue
    if not x.shape.is_fully_defined():
      if x.shape.rank == 1 and x.dtype.is_integer:
        continue
      return None
    if not hasattr(x, 'op'):  # A variable.
      total += math.prod(x.shape.as_list()) * x.dtype.size
      continue
    if x.dtype.name == 'variant':  # A run's list (layers/shared_run.py).
      from gpipe_tf.layers import shared_run  # pylint: disable=g-import-not-at-top
      got = shared_run.ListBytes(x)
      if got is None:
        return None
      total += got[0]
      tensors.extend(got[1])  # The run's input and output it holds.
      continue
    key = _Buffer(x)
    if key in seen:
      continue
    seen.add(key)
    total += math.prod(x.shape.as_list()) * x.dtype.size
  return total


def ProgramBytes(program: Program) -> memory_lib.StageBytes | None:
  """The StageBytes of one traced program (module docstring), or None when
  a size is not known statically."""
  t = program.tensors
  x = t[Role.X] + t[Role.SKIP_IN]
  inputs = frozenset(_Buffer(v) for v in x if v is not None)
  sizes = [_Bytes(x), _Bytes(t[Role.SAVED], inputs), _Bytes(t[Role.WCUT]),
           _Bytes(t[Role.PINNED]), _Bytes(t[Role.DWS]),
           _Bytes(program.variables)]
  if any(size is None for size in sizes):
    return None
  return memory_lib.StageBytes(*map(float, sizes))


def TracedStageBytes(cells: Sequence[Any]) -> list | None:
  """One schedule.memory.StageBytes per cell, from the training program the
  cell traced, or None when TrainingPrograms is None or a program's sizes
  are unknown (micro-batches of different sizes).

  Args:
    cells: a PipeliningLayer's cells, after one training step was traced.
  """
  programs = TrainingPrograms(cells)
  if programs is None:
    return None
  stages = [ProgramBytes(p) for p in programs]
  return None if any(s is None for s in stages) else stages


@dataclasses.dataclass(frozen=True)
class ActionScope:
  """One action's name scope in an op's name.

  Attributes:
    name: the scope (``stage2_F_mb6``, ``stage0_BW_t11``).
    stage, kind: the action's stage and kind.
    micro_batch: its micro-batch when built at its own tick, else None.
    column: its tick program column when built in a loop's body, else None.
    end: where the scope ends in the op's name (after its '/'): an op whose
      name has no '/' after it is a direct child of the scope.
  """
  name: str
  stage: int
  kind: str
  micro_batch: int | None
  column: int | None
  end: int


def FindActionScope(op_name: str) -> ActionScope | None:
  """The first action scope with a micro-batch or column in `op_name` (a
  switch branch's scope, ``stage1_FB``, names no action and is skipped), or
  None. What a stage takes in at a tick is under a scope of its own, read
  with kind ``RECV`` (``stage1_RECV_t4``: ticks.ReceiptScope)."""
  found = ticks.SCOPE.search(op_name)
  while found and found.group(3) is None:  # Search on from its last '/'.
    found = ticks.SCOPE.search(op_name, found.end() - 1)
  if found:
    n = int(found.group(4))
    mb = found.group(3) == 'mb'
    start = found.start() + (found.group(0)[0] == '/')
    return ActionScope(op_name[start:found.end() - 1], int(found.group(1)),
                       found.group(2), n if mb else None,
                       None if mb else n, found.end())
  return None
