"""Every stage's per-micro-batch state while a tick program runs: the Slots type, and making, reading and writing them.

The interpreter (interpreter.py) keeps these on each stage's device; see its
docstring for what each slot holds and who writes it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import tensorflow as tf

from gpipe_tf.pipeline import tensor_loop as tl

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


TensorArrays = list  # of tf.TensorArray | None, one per flat tensor
Tensors = list       # of tf.Tensor | None, one per flat tensor
Lists = list         # of packed TensorLists (tensor_loop.Packed), one a dtype


class Slots(NamedTuple):
  """One stage's state while a program runs, on its device (None where the
  stage has none). Every step of the stage maps it to a new Slots
  (interpreter.py); tick_graph.py carries it from tick to tick.

  Attributes:
    x: its inputs: per flat input, a TensorArray of M slots (M + 1: a
      neighbour writes them, tick_graph's spare slot; stage 0's hold the
      split mini-batch, interpreter.Start), emptied by the micro-batch's
      last step that reads them (its F, or its recomputing backward); an
      input without batch dimension is the tensor itself.
    dy: its output gradients, the same way (stages before the last, or
      every stage when the loss is outside); each slot is read once.
    saved: the activations each kept forward stashes for its backward.
    pinned: the non-trainable values each forward read (for a recompute).
    wcut: what each B stashes for its W.
    y: the output of its latest F (stages before the last).
    dx: the input gradient of its latest B or BW (stages after the first).
    acc: its weight gradients, summed over micro-batches.
    bn: its BatchNorm sufficient statistics, summed.
    sums: the loss sums (last stage, loss inside).
    out: per flat output, a TensorArray of M slots (last stage, loss
      outside).
    dx0: per flat input, a TensorArray of M slots (stage 0, input
      gradients).
    skip_in: per skip an earlier stage stashed for this one
      (Cell.skip_in), a TensorArray of M + 1 slots the stashing stage writes
      (tick_graph's receipts), emptied by the micro-batch's last step that
      reads it (its F, or its recomputing backward); no stage in between
      has one.
    skip_out: the skips its latest F stashed for later stages
      (Cell.skip_out).
    dskip_out: per skip it stashed for a later stage, a TensorArray of
      M + 1 slots of its gradient, written by the popping stage, each read
      once.
    dskip_in: the gradients of skip_in its latest backward made.
    stamps: with a trace, (start, end) TensorArrays of timestamps by tick.
    token: a scalar made once the stage's latest step has finished (the
      loop orders a device's steps on it).

  saved, pinned and wcut hold M slots per tensor, acc and bn one; all five
  are packed (Layout says where each tensor is).
  """
  x: TensorArrays | None = None
  dy: TensorArrays | None = None
  saved: Lists | None = None
  pinned: Lists | None = None
  wcut: Lists | None = None
  y: Tensors | None = None
  dx: Tensors | None = None
  acc: Lists | None = None
  bn: Lists | None = None
  sums: Tensors | None = None
  out: TensorArrays | None = None
  dx0: TensorArrays | None = None
  skip_in: TensorArrays | None = None
  skip_out: Tensors | None = None
  dskip_out: TensorArrays | None = None
  dskip_in: Tensors | None = None
  stamps: tuple[tf.TensorArray, tf.TensorArray] | None = None
  token: tf.Tensor | None = None


def Gather(row: Sequence[int], t: Any) -> Any:
  """row[t]: a Python int when t is one (unrolled), else a gather."""
  return row[t] if isinstance(t, int) else tf.gather(tf.constant(row), t)


def Write(slots: Sequence[Any], m: Any, values: Sequence[Any]) -> list:
  """`slots` with micro-batch m of each set to its value."""
  return [None if s is None else s.write(m, v)
          for s, v in zip(slots, values)]


def _Arrays(specs: Sequence[Any], size: int, read_once: bool = False) -> list:
  """A TensorArray of `size` slots per spec; `read_once` ones take any
  number of examples, so that Take can empty a slot it read."""
  return [None if s is None else tl.TensorArrayOf(
      tl.SpecOf(s, None) if read_once else s, size, read_once) for s in specs]


def Take(slots: Sequence[Any], m: Any, specs: Sequence[Any],
         empty: bool = True, known: Sequence[Any] | None = None
         ) -> tuple[list, list]:
  """(micro-batch m of each read-once slot, the slots with it emptied, or
  with `empty=False` still in place: a read a later step's Take follows).
  `known` (None where to read) are the slots' values at m, known without
  a read (taken through an identity made here): the slot is only emptied.

  Emptying frees the tensor once its reader is done: a TensorArray in a
  tf.function is a TensorList, which keeps every item, read or not, until
  it is overwritten (clear_after_read is not honoured), so a kept forward's
  activations would otherwise live until the end of the step and no
  schedule's memory bound would hold. Left in place, an eager TensorArray's
  read-once read has cleared it, so there it is written back.
  """
  known = known or [None] * len(slots)
  values, after = [], []
  for ta, spec, value in zip(slots, specs, known):
    if value is not None and isinstance(ta, tf.TensorArray):
      # An op made here, under the step's control dependencies, as a read
      # is: the piece's ops that read the value wait for the device's
      # previous step (the function call itself is inlined away).
      values.append(tf.identity(value))
      after.append(ta.write(m, tl.Empty(value)) if empty and spec.shape.rank
                   else ta)
      continue
    value = ta  # None, or a shared tensor: itself.
    if isinstance(ta, tf.TensorArray):
      value = ta.read(m)
      value.set_shape(spec.shape)
      if empty and spec.shape.rank:
        ta = ta.write(m, tl.Empty(value))
      elif not empty and tf.executing_eagerly():
        ta = ta.write(m, value)
    values.append(value)
    after.append(ta)
  return values, after


class Layout(NamedTuple):
  """Where a stage's packed slots keep each tensor (tensor_loop.Packed):
  its weight-gradient sums (`acc`), BatchNorm sums (`bn`), and the
  per-micro-batch `saved`, `pinned` and `wcut` tensors. None in inference.
  """
  acc: tl.Packed
  bn: tl.Packed
  saved: tl.Packed
  pinned: tl.Packed
  wcut: tl.Packed


def LayoutOf(program: Any, m: int) -> Layout:
  """Where a training stage's packed slots keep each tensor of `program`
  (a cell_program.CellProgram), with `m` micro-batches."""
  return Layout(*(tl.Packed(program.Specs(role), size) for role, size in (
      ('dws', 1), ('bn', 1), ('saved', m), ('pinned', m), ('wcut', m))))


def Make(compiled: Any, s: int) -> Slots:
  """Stage s's empty slots on its device, for an interpreter.Compiled step
  (its programs, stage s's Layout, None in inference, the micro-batches,
  whether the loss is inside and stage 0 returns input gradients, and the
  examples per micro-batch, None when they vary)."""
  c, m = compiled, compiled.schedule.num_micro_batches
  program, layout, last = c.programs[s], c.layouts[s], len(c.programs) - 1
  loss_here = c.loss_inside and s == last

  def _Fillers(role):
    return [tl.Filler(v) if v else None for v in program.Specs(role)]

  # Slots a neighbour, or the stage that stashed a skip, writes have a
  # spare slot M (tick_graph's receipts).
  with tf.device(c.cells[s].device):
    slots = Slots(
        x=None if s == 0 else _Arrays(c.programs[s - 1].out_specs, m + 1,
                                      read_once=True),
        y=None if s == last else _Fillers('y'),
        skip_in=(_Arrays(program.Specs('skip_in'), m + 1, read_once=True)
                 if program.tensors.skip_in else None),
        skip_out=_Fillers('skip_out') if program.tensors.skip_out else None,
        out=(_Arrays(program.out_specs, m) if s == last and not loss_here
             else None),
        token=tf.zeros([]))
    if layout is None:
      return slots

    def _Zeros(packed):
      return packed.Initial([None if d is None else tf.zeros(d.shape, d.dtype)
                             for d in packed.specs])

    return slots._replace(
        dy=None if loss_here else _Arrays(
            program.Specs('dy'), m + (s < last), read_once=True),
        saved=layout.saved.Initial(),
        pinned=layout.pinned.Initial(),
        wcut=layout.wcut.Initial(),
        dx=None if s == 0 else _Fillers('dx'),
        acc=_Zeros(layout.acc),
        bn=_Zeros(layout.bn),
        sums=([tf.zeros(v.shape, v.dtype) for v in program.Specs('sums')]
              if loss_here else None),
        dx0=(_Arrays([None if g is None else tl.SpecOf(g, c.batch)
                      for g in program.tensors.dx], m)
             if s == 0 and c.input_grads else None),
        dskip_out=(_Arrays(program.Specs('dskip_out'), m + 1, read_once=True)
                   if program.tensors.skip_out else None),
        dskip_in=_Fillers('dskip_in') if program.tensors.skip_in else None)
