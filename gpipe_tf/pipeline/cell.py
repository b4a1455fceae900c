"""A pipeline cell: a contiguous run of layers placed on one device.

A ``Cell`` is what one stage of a schedule runs. It owns no variables itself:
its layers (children of the PipeliningLayer) do, created on the cell's device.
Cells take and return *flat* lists of tensors plus the nest structure they came
in, so the interpreter can pass boundary tensors between devices without
knowing what a layer returns. A skip (layers/skips.py) stashed in one cell
and popped in a later one leaves the first as one of its ``skip_out`` and
enters the second as one of its ``skip_in``; ``Routes`` pairs them up, and
the cells in between never see it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core

__all__ = ['Cell', 'IsFloat', 'Route', 'Routes', 'Unique']


def Unique(variables: Sequence[tf.Variable]) -> list[tf.Variable]:
  """`variables` without repeats, in first-seen order.

  A variable two layers of a cell track (a tied embedding and softmax, a
  block shared ALBERT-style) is one source of gradient: differentiated once,
  it gets the sum of its uses' gradients; listed twice, each entry would get
  that whole sum and the step would apply it twice.
  """
  seen, out = set(), []
  for v in variables:
    if v.ref() not in seen:
      seen.add(v.ref())
      out.append(v)
  return out


class Cell:
  """Stage `index` of a pipeline: its layers and the device they run on.

  Attributes:
    index: the stage.
    layers: its layers, in order.
    device: the device its ops run on.
    variables: the trainable variables its layers track, each once.
    programs: the cell's traced programs (cell_program.CellProgram), cached
      by what they were traced for (cell_program.ProgramKey).
    skip_in: the names of the skips its layers pop that earlier cells
      stashed, in the order its forward takes them.
    skip_out: the names of the skips its layers stash that later cells pop,
      in the order its forward returns them.
    compiled: of the first cell, the steps (interpreter.Compiled) built
      over the cells, latest first, a few: what run_errors reads to say
      which action an op that failed as a step ran belongs to.
  """

  def __init__(self, index: int, layers: Sequence[base_layer.BaseLayer],
               device: str, skip_in: Sequence[str] = (),
               skip_out: Sequence[str] = ()) -> None:
    self.index = index
    self.layers = list(layers)
    self.device = device
    self.skip_in = tuple(skip_in)
    self.skip_out = tuple(skip_out)
    self.variables = Unique(
        [v for l in self.layers for v in l.trainable_variables])
    self.programs: dict[Any, Any] = {}
    self.compiled: collections.deque = collections.deque(maxlen=4)

  def Run(self, structure: Any, flat: Sequence[Any], training: bool) -> tuple:
    """Runs the layers on the inputs `flat` packed as `structure` (a cell
    without skips from earlier cells); returns its outputs."""
    return self.Forward(structure, flat, (), training)[0]

  def Forward(self, structure: Any, flat: Sequence[Any],
              skips: Sequence[Any], training: bool) -> tuple[tuple, tuple]:
    """Runs the layers on the inputs `flat` packed as `structure`, with
    `skips` the tensors of `skip_in`; returns (its outputs, the tensors of
    `skip_out`)."""
    xs = tf.nest.pack_sequence_as(structure, list(flat))
    out, stashed = core.RunWithSkips(self.layers, xs,
                                     dict(zip(self.skip_in, skips)), training)
    return (core.AsTuple(core.FromTuple(out)),
            tuple(stashed.pop(n) for n in self.skip_out))

  def OnDevice(self, device: str) -> 'Cell':
    """The same layers placed on another device (a data-parallel replica).

    The copy traces its own programs: a program traced in one replica's
    context captures that replica's copies of the variables.
    """
    return Cell(self.index, self.layers, device, self.skip_in, self.skip_out)


@dataclasses.dataclass(frozen=True)
class Route:
  """Where one skip goes: from cell `src`'s `skip_out[out_index]` to cell
  `dst`'s `skip_in[in_index]`."""
  name: str
  src: int
  dst: int
  out_index: int
  in_index: int


def Routes(cells: Sequence[Cell]) -> tuple[Route, ...]:
  """The skips that cross cells, in the order of the stashing cells'
  skip_out."""
  routes = []
  for c in cells:
    for i, n in enumerate(c.skip_out):
      # The first later cell that takes it in.
      dst = next(d for d in cells[c.index + 1:] if n in d.skip_in)
      routes.append(Route(n, c.index, dst.index, i, dst.skip_in.index(n)))
  return tuple(routes)


def IsFloat(x: Any) -> bool:
  """Whether `x` is a floating-point tensor (one that gets gradients)."""
  return x is not None and x.dtype.is_floating
