"""The table of roles: every tensor a step of a cell's program reads or makes, declared once.

A role is what a tensor is to one micro-batch's step of a stage: its input x,
the activations a kept forward saves, the gradient of its weights dws, ...
Each ``Role`` member says, once, which pieces make it and read it (a piece is
a step's share of the cell's program, cell_program.Piece; ``Piece`` below
names its variants), where the stage keeps it between steps (``Store``), from
which role of which stage it arrives (``Link``), when its slot is freed
(``Freed``), its name in the merged outputs and what it means. The engine
reads this table instead of naming roles as strings:

* cell_program.CellProgram._Signature: what a step's piece reads and makes;
* interpreter._Step: which slots a step takes, frees and writes;
* slots.Slots, slots.Layout, slots.Make: one field (or packed list) per
  stored role;
* tick_graph.TickGraph._Receive: what arrives from where.

A misspelt role (``Role.SAVD``) raises UnknownRoleError where it is
written; ``Check`` (run on this table at import) refuses a table whose piece
reads a role no earlier piece makes and nothing sends. docs/pipeline.md's
table of roles is checked against this one (tests/pipeline/roles_test.py).

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

import enum
from typing import Any, Iterable, Mapping, Sequence

from gpipe_tf import errors
from gpipe_tf.pipeline.schedule import ticks

__all__ = ['Check', 'Freed', 'Link', 'Piece', 'Role', 'RoleError',
           'Signature', 'Store', 'Tensors', 'UnknownRoleError']


class RoleError(errors.Error, ValueError):
  """A table of roles that does not hold together (Check)."""


class UnknownRoleError(errors.Error, AttributeError):
  """A role that is not in the table (a misspelt name)."""


class Piece(enum.Enum):
  """The variants of a step's piece: its kind (ticks.Step.kind), whether a
  forward keeps its activations or a backward reads them (``keep``, else it
  recomputes), and whether an FB leaves its W for later. FORWARD is the
  forward of inference (no backward to keep anything for)."""
  FORWARD = 'forward (inference)'
  F_KEEP = 'F keeping its activations'
  F_REMAT = 'F whose backward recomputes'
  B_KEEP = 'B from saved activations'
  B_REMAT = 'B recomputing the forward'
  BW_KEEP = 'BW from saved activations'
  BW_REMAT = 'BW recomputing the forward'
  W = 'W'
  FB = 'FB (F, loss and backward)'
  FB_DEFERS_W = 'FB whose W runs later'

  @classmethod
  def Of(cls, step: ticks.Step, training: bool) -> Piece:
    """The variant `step` runs."""
    if not training:
      return cls.FORWARD
    if step.kind in ('W', 'FB'):
      return cls.FB_DEFERS_W if step.defers_w else cls[step.kind]
    return cls[f'{step.kind}_{"KEEP" if step.keep else "REMAT"}']


class Store(enum.Enum):
  """Where a stage keeps a role's tensors between its steps (slots.Slots)."""
  FEEDS = 'interpreter.Feeds: made by Start, read by every tick, never written'
  SLOTS = 'a TensorArray of M slots per tensor (+1: a spare for receipts)'
  PACKED = 'M slots per tensor, packed as one TensorList per dtype'
  LATEST = "the latest step's tensors, for a receiver to take in"
  PACKED_SUM = 'summed over micro-batches, packed like PACKED (one slot)'
  SUM = 'summed over micro-batches, one tensor each (a few scalars)'


class Link(enum.Enum):
  """From which stage a received role arrives, the tick after its sender
  made it (ticks.TickProgram's receipt rows)."""
  PREVIOUS = "stage s-1 (got_y; stage 0's: interpreter.Start)"
  NEXT = ("stage s+1 (got_dx; the last stage's, loss outside: "
          'interpreter.FeedOutputGradients)')
  STASHER = "the stage that stashed the skip (a cell.Route's src, got_skip)"
  POPPER = "the stage that popped the skip (a cell.Route's dst, got_dskip)"


class Freed(enum.Enum):
  """When a role's slot lets its tensor go."""
  TAKEN = 'by the one step that reads it (emptied as it is read)'
  LAST_READ = "by the micro-batch's last step that reads it (F or recompute)"
  REPLACED = "by the stage's next step that makes it"
  KEPT = 'never during the step: read out after the last tick'


_P = Piece
_FORWARDS = {_P.FORWARD, _P.F_KEEP, _P.F_REMAT}
_RECOMPUTES = {_P.B_REMAT, _P.BW_REMAT}
_BACKWARDS = {_P.B_KEEP, _P.BW_KEEP} | _RECOMPUTES
_FUSED = {_P.FB, _P.FB_DEFERS_W}
_READS_X = _FORWARDS | _RECOMPUTES | _FUSED
_TOTALS = _FORWARDS - {_P.FORWARD} | _FUSED  # Training forwards.


def _R(made_by, read_by, store, meaning, loss=None, source=None,
       freed=Freed.KEPT, merged=None):
  """A Role's value (Role's docstring), with its defaults."""
  return (frozenset(made_by), frozenset(read_by), store, meaning, loss,
          source, freed, merged)


class _Table(enum.EnumMeta):
  """Role's metaclass: a name not in the table raises UnknownRoleError."""

  def __getattr__(cls, name):
    if name.startswith('_'):
      return super().__getattr__(name)
    raise UnknownRoleError(f'no role {name!r} in the table of roles: '
                           f'{", ".join(cls.__members__)}')


class Role(enum.Enum, metaclass=_Table):
  """The table: one member per role (the module docstring).

  Attributes:
    made_by, read_by: the Pieces that make it and that read it.
    store: where a stage keeps it between steps.
    meaning: one line.
    loss: True where it exists only with the loss inside, False only
      without, None either way.
    source: for a role that arrives from another stage, (the sender's role,
      by its member name; from which stage).
    freed: when its slot lets it go.
    merged: its slots.Slots field of every micro-batch's value, concatenated
      into the step's outputs (interpreter.Merged), or None.
  """

  def __init__(self, *value: Any) -> None:
    (self.made_by, self.read_by, self.store, self.meaning, self.loss,
     self.source, self.freed, self.merged) = value

  def __repr__(self) -> str:
    return f'Role.{self.name}'

  @property
  def field(self) -> str:
    """Its slots.Slots field (Feeds' for FEEDS): the member's, lowercase."""
    return self.name.lower()

  def Sender(self) -> Role:
    """The role of the stage it arrives from (`source`)."""
    return Role[self.source[0]]

  SEED = _R((), _READS_X, Store.FEEDS, "the micro-batch's seed (one tensor)")
  X = _R((), _READS_X, Store.SLOTS, "the cell's flat inputs (stage 0's: the "
         'split mini-batch)', source=('Y', Link.PREVIOUS),
         freed=Freed.LAST_READ)
  SKIP_IN = _R((), _READS_X, Store.SLOTS, 'the skips it pops that earlier '
               'cells stashed', source=('SKIP_OUT', Link.STASHER),
               freed=Freed.LAST_READ)
  LABELS = _R((), _READS_X, Store.FEEDS, 'the flat labels', loss=True)
  SAVED = _R({_P.F_KEEP}, {_P.B_KEEP, _P.BW_KEEP}, Store.PACKED, 'the '
             'forward tensors a kept forward stashes for its backward',
             freed=Freed.TAKEN)
  DY = _R((), _BACKWARDS, Store.SLOTS, 'the gradients of the flat outputs',
          loss=False, source=('DX', Link.NEXT), freed=Freed.TAKEN)
  DSKIP_OUT = _R((), _BACKWARDS, Store.SLOTS, 'the gradients of skip_out, '
                 'from the cells that popped them',
                 source=('DSKIP_IN', Link.POPPER), freed=Freed.TAKEN)
  PINNED = _R({_P.F_REMAT}, _RECOMPUTES, Store.PACKED, 'the non-trainable '
              'values (BatchNorm moving statistics) its forward read',
              freed=Freed.TAKEN)
  Y = _R(_FORWARDS, (), Store.LATEST, 'the flat outputs', loss=False,
         freed=Freed.REPLACED, merged='outputs')
  SKIP_OUT = _R(_FORWARDS, (), Store.LATEST, 'the skips it stashes that '
                'later cells pop', freed=Freed.REPLACED)
  BN = _R(_TOTALS, (), Store.PACKED_SUM, 'the BatchNorm sufficient '
          'statistics, three per BatchNorm layer, as one vector per dtype '
          '(CellProgram.bn_flat)')
  SUMS = _R(_TOTALS, (), Store.SUM, 'the flat loss.Sums', loss=True)
  DX = _R(_BACKWARDS | _FUSED, (), Store.LATEST, 'the gradients of the flat '
          'inputs', freed=Freed.REPLACED, merged='input_grads')
  DSKIP_IN = _R(_BACKWARDS | _FUSED, (), Store.LATEST, 'the gradients of '
                'skip_in', freed=Freed.REPLACED)
  WCUT = _R({_P.B_KEEP, _P.B_REMAT, _P.FB_DEFERS_W}, {_P.W}, Store.PACKED,
            'what W reads from B (layer inputs and output gradients)',
            freed=Freed.TAKEN)
  DWS = _R({_P.BW_KEEP, _P.BW_REMAT, _P.W, _P.FB}, (), Store.PACKED_SUM,
           'the gradients of CellProgram.variables, the small ones as one '
           'vector per dtype (CellProgram.dws_flat)')


def Check(table: Iterable[Role]) -> None:
  """Checks a table of roles: every role a piece reads comes from Feeds,
  arrives from another stage's role or is made by a piece that runs before
  it (a forward before a backward before W); every sender is a LATEST role.

  Raises:
    RoleError: naming the first role that breaks one of these.
  """
  table = list(table)
  order = {p: 0 if p in _FORWARDS else 2 if p is Piece.W else 1
           for p in Piece}
  for role in table:
    sender = role.source and type(role)[role.source[0]]
    if sender and (sender not in table or sender.store is not Store.LATEST):
      raise RoleError(f'role {role.name} arrives from {sender.name}, which '
                      'is not a LATEST role of the table')
    for piece in role.read_by:
      if not (sender or role.store is Store.FEEDS or
              any(order[p] < order[piece] for p in role.made_by)):
        raise RoleError(f'role {role.name} is read by {piece.name} before '
                        'any piece makes it, and nothing sends it')


def Signature(piece: Piece, loss: bool
              ) -> tuple[tuple[Role, ...], tuple[Role, ...]]:
  """(the roles `piece` reads, the roles it makes), in the table's order,
  with or without the loss inside. Where the program cannot prune W apart
  from B (CellProgram.w_separable), its B makes DWS instead of WCUT."""
  def _Here(role):
    return role.loss is None or role.loss == loss
  return (tuple(r for r in Role if piece in r.read_by and _Here(r)),
          tuple(r for r in Role if piece in r.made_by and _Here(r)))


class Tensors:
  """One micro-batch's tensors of a cell's step, by Role: what a program
  traced, what a piece is fed and what it makes. Each role's value is a
  tuple with None where the program has no tensor (a None input, an integer
  output's gradient); a role it does not hold is ().
  Compared by identity, never by its tensors.

  Raises:
    UnknownRoleError: built with a key that is not a Role (a string).
  """

  def __init__(self, by_role: Mapping[Role, Sequence[Any]] = ()) -> None:
    self._by_role = {r: tuple(v) for r, v in dict(by_role).items()}
    for role in self._by_role:
      if not isinstance(role, Role):
        raise UnknownRoleError(f'{role!r} is not a Role')

  def __getitem__(self, role: Role) -> tuple:
    return self._by_role.get(role, ())

  def With(self, by_role: Mapping[Role, Sequence[Any]]) -> Tensors:
    """These tensors with the roles of `by_role` replaced."""
    return Tensors({**self._by_role, **by_role})

  def Present(self, *roles: Role) -> list:
    """The non-None tensors of `roles`, in order."""
    return [x for role in roles for x in self[role] if x is not None]


Check(Role)
