"""Every stage's per-micro-batch state while a tick program runs: the Slots type, and making, reading and writing them.

The interpreter (interpreter.py) keeps these on each stage's device; see its
docstring for what each slot holds and who writes it.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import tensorflow as tf

from gpipe_tf.pipeline import tensor_loop as tl
from gpipe_tf.pipeline import tf_internals
from gpipe_tf.pipeline.roles import Piece
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.roles import Store

if TYPE_CHECKING:
  from gpipe_tf.pipeline import cell_program
  from gpipe_tf.pipeline import interpreter

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


_KEPT = tuple(r for r in Role if r.store is not Store.FEEDS)
_MERGED = tuple(r for r in _KEPT if r.merged)
_FIELDS = ([r.field for r in _KEPT] + [r.merged for r in _MERGED] +
           ['stamps', 'token'])


class Slots(collections.namedtuple('Slots', _FIELDS,
                                   defaults=(None,) * len(_FIELDS))):
  """One stage's state while a program runs, on its device: one field per
  role the stage keeps between steps (roles.Role: every role but the Feeds',
  named as its member in lowercase, holding what its Store says), one per
  merged role (Role.merged: every micro-batch's value, a TensorArray of M
  slots per flat tensor), and (None where the stage has none):

    stamps: with a trace, (start, end) TensorArrays of timestamps by tick.
    token: a scalar made once the stage's latest step has finished (the
      loop orders a device's steps on it).

  Every step of the stage maps it to a new Slots (interpreter._Step);
  tick_graph.py carries it from tick to tick and writes what arrives.
  A tuple, so that tf.nest and the loops carry it.
  """
  __slots__ = ()

  def Of(self, role: Role) -> Any:
    """The stage's slots of `role` (None where it has none)."""
    return self[_FIELDS.index(role.field)]

  def Merged(self, role: Role) -> Any:
    """The merged slots of `role` (Role.merged; None where none)."""
    return self[_FIELDS.index(role.merged)] if role.merged else None

  def With(self, slots: Mapping[Role, Any] = {},
           merged: Mapping[Role, Any] = {}, **others: Any) -> Slots:
    """These slots with those of `slots`' roles, `merged`'s merged roles
    and `others` (stamps, token) replaced."""
    return self._replace(**{r.field: v for r, v in slots.items()},
                         **{r.merged: v for r, v in merged.items()}, **others)


def Gather(row: Sequence[int], t: Any) -> Any:
  """row[t]: a Python int when t is one (unrolled), else a gather."""
  return row[t] if isinstance(t, int) else tf.gather(tf.constant(row), t)


def Write(slots: Sequence[Any], m: Any, values: Sequence[Any]) -> list:
  """`slots` with micro-batch m of each set to its value."""
  index = tf_internals.Index(m)
  return [None if s is None else s.write(index, v)
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
  index = tf_internals.Index(m)
  values, after = [], []
  for ta, spec, value in zip(slots, specs, known):
    if value is not None and isinstance(ta, tf.TensorArray):
      # An op made here, under the step's control dependencies, as a read
      # is: the piece's ops that read the value wait for the device's
      # previous step (the function call itself is inlined away).
      values.append(tf.identity(value))
      after.append(ta.write(index, tl.Empty(value))
                   if empty and tl.HoldsMemory(spec) else ta)
      continue
    value = ta  # None, or a shared tensor: itself.
    if isinstance(ta, tf.TensorArray):
      value = ta.read(index)
      value.set_shape(spec.shape)
      if empty and tl.HoldsMemory(spec):
        ta = ta.write(index, tl.Empty(value))
      elif not empty and tf.executing_eagerly():
        ta = ta.write(index, value)
    values.append(value)
    after.append(ta)
  return values, after


# Where a stage's packed slots keep each tensor of a PACKED or PACKED_SUM
# role (tensor_loop.Packed: M slots per tensor, or one for a sum).
Layout = Mapping[Role, tl.Packed]
_PACKED = tuple(r for r in Role if r.store in (Store.PACKED, Store.PACKED_SUM))


def LayoutOf(program: cell_program.CellProgram, m: int) -> Layout:
  """Where a training stage's packed slots keep each tensor of `program`,
  with `m` micro-batches."""
  return {r: tl.Packed(program.Specs(r), m if r.store is Store.PACKED else 1)
          for r in _PACKED}


def Make(compiled: interpreter.Compiled, s: int) -> Slots:
  """Stage s's empty slots on its device, for a Compiled step: each role
  the stage keeps (in inference, the forward's only) made as its Store says
  (interpreter.Start fills stage 0's x)."""
  c, m = compiled, compiled.schedule.num_micro_batches
  program, layout, last = c.programs[s], c.layouts[s], len(c.programs) - 1
  loss_here = c.loss_inside and s == last
  pops, stashes = bool(program.tensors[Role.SKIP_IN]), bool(
      program.tensors[Role.SKIP_OUT])
  # Whether the stage has the role: a receipt's sender or a receiver exists.
  here = {Role.X: s > 0, Role.SKIP_IN: pops, Role.DY: not loss_here,
          Role.DSKIP_OUT: stashes, Role.Y: s < last, Role.SKIP_OUT: stashes,
          Role.SUMS: loss_here, Role.DX: s > 0, Role.DSKIP_IN: pops}
  # Slots a neighbour, or the stage that stashed a skip, writes have a
  # spare slot M (tick_graph's receipts).
  sizes = {Role.DY: m + (s < last)}

  def _New(role):
    specs = program.Specs(role)
    if role.store is Store.SLOTS:
      return _Arrays(specs, sizes.get(role, m + 1), read_once=True)
    if role.store is Store.LATEST:
      return [tl.Filler(v) if v else None for v in specs]
    if role.store is Store.PACKED:
      return layout[role].Initial()
    if role in _PACKED:  # Sums: every slot reads as zeros until added to.
      return layout[role].Zeros()
    return [None if d is None else tf.zeros(d.shape, d.dtype) for d in specs]

  with tf.device(c.cells[s].device):
    slots = Slots(token=tf.zeros([])).With({
        role: _New(role) for role in _KEPT if here.get(role, True) and (
            layout is not None or Piece.FORWARD in role.made_by | role.read_by
        )}, {Role.Y: _Arrays(program.out_specs, m)} if s == last and
        not loss_here else {})
    if layout is not None and s == 0 and c.input_grads:
      slots = slots.With(merged={Role.DX: _Arrays(
          [None if g is None else tl.SpecOf(g, c.batch)
           for g in program.tensors[Role.DX]], m)})
  return slots
