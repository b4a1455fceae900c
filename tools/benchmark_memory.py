"""The memory model's sizes of a pipelined step, read from the step the engine traced: what each stage holds per micro-batch.

tools.plan estimates a stage's activations from its layers' FPropMeta output
shapes, before anything is built. That is right for a layer whose backward
reads about its output (an FC layer), and far under for one that keeps more
(a Transformer block keeps its attention probabilities, its feed-forward's
4d-wide hidden layer and its layer norms' inputs). Once a step has been
traced, every stage's cell program knows exactly which tensors a kept
forward stashes for its backward, what a B stashes for its W and what a
recomputing backward is fed (cell_program.CellProgram.tensors): this module
turns those into schedule.memory.StageBytes, so that tools.benchmark's
"model MiB" is the schedule's memory profile over the sizes the step really
holds, beside the measured peak::

    input        the stage's flat inputs and the skips it pops   (x, skip_in)
    activations  what a kept forward stashes, less its inputs    (saved)
    wcut         what a B stashes for its W                      (wcut)
    pinned       what a recomputing backward is fed              (pinned)
    gradients    the weight-gradient sums                        (dws)
    weights      the variables the stage reads

Each buffer counts once: a stashed tensor that is a view of another (a
Reshape's output shares its input's buffer) adds nothing. It reads the
engine's internal types: a benchmark's view, not an API.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import memory as memory_lib

__all__ = ['ProgramBytes', 'TracedStageBytes']


# Ops whose output shares its input's buffer (TensorFlow forwards it): a
# stashed tensor made by one holds no memory of its own beside its input.
_VIEWS = frozenset({'Reshape', 'ExpandDims', 'Squeeze', 'Identity',
                    'IdentityN', 'StopGradient', 'EnsureShape'})


def _Root(x: Any) -> Any:
  """The tensor whose buffer `x` is a view of (itself if none)."""
  while x.op.type in _VIEWS:
    x = x.op.inputs[x.value_index if x.op.type == 'IdentityN' else 0]
  return x


def _Bytes(tensors: Sequence[Any], exclude: frozenset = frozenset()
           ) -> int | None:
  """Bytes of one micro-batch's tensors, each buffer once (views of one
  buffer, None leaves and tensors whose buffer is in `exclude` count 0);
  None when a shape is not known statically. An integer vector of unknown
  length in a step traced on static shapes is shape arithmetic (the axes a
  broadcast's gradient sums over, say) and counts 0."""
  total, seen = 0, set(exclude)
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
    root = _Root(x)
    if id(root) in seen:
      continue
    seen.add(id(root))
    total += math.prod(x.shape.as_list()) * x.dtype.size
  return total


def ProgramBytes(program: Any) -> memory_lib.StageBytes | None:
  """The StageBytes of one cell_program.CellProgram (module docstring), or
  None when a size is not known statically."""
  t = program.tensors
  x = t[Role.X] + t[Role.SKIP_IN]
  inputs = frozenset(id(_Root(v)) for v in x if v is not None)
  sizes = [_Bytes(x), _Bytes(t[Role.SAVED], inputs), _Bytes(t[Role.WCUT]),
           _Bytes(t[Role.PINNED]), _Bytes(t[Role.DWS]),
           _Bytes(program.variables)]
  if any(size is None for size in sizes):
    return None
  return memory_lib.StageBytes(*map(float, sizes))


def TracedStageBytes(cells: Sequence[Any]) -> list | None:
  """One schedule.memory.StageBytes per cell, from the training program the
  cell traced (cell_program.CellProgram), or None when a cell has traced no
  training program, or several (the sizes of which one is meant would be a
  guess), or one of unknown sizes (micro-batches of different sizes).

  Args:
    cells: a PipeliningLayer's cells, after one training step was traced.
  """
  stages = []
  for cell in cells:
    programs = [p for p in cell.programs.values() if p.training]
    if len(programs) != 1:
      return None
    stage = ProgramBytes(programs[0])
    if stage is None:
      return None
    stages.append(stage)
  return stages
