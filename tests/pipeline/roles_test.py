"""The table of roles: a misspelt role or a role read before it is written fails where it is written (roles.py)."""

import enum
import os
import unittest

from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline.roles import Piece
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.roles import Store

_DOC = os.path.join(os.path.dirname(__file__), '..', '..', 'docs',
                    'pipeline.md')
_BEGIN = '<!-- The table of roles: roles_test.GlossaryRows(), from roles.py -->'
_END = '<!-- End of the table of roles -->'


def GlossaryRows():
  """docs/pipeline.md's table of roles, read off the table: per role, the
  type and field that hold it and the function that writes it."""
  rows = ['| role | what it is | held in | written by | read by | freed |',
          '|---|---|---|---|---|---|']
  for role in Role:
    pieces = lambda ps: ', '.join(p.name for p in Piece if p in ps) or '-'
    if role.store is Store.FEEDS:
      held, writer = '`interpreter.Feeds`', '`interpreter.Start`'
    else:
      held = f'`Slots.{role.field}` ({role.store.name})'
      writer = (f'`tick_graph` (`_Receive`): `{role.Sender().name}` of '
                f'{role.source[1].value}' if role.source else
                '`interpreter._Step`, from the Tensors of ' +
                pieces(role.made_by))
    if role.merged:
      held += f', every micro-batch\'s in `Slots.{role.merged}`'
    loss = {True: ' (loss inside)', False: ' (loss outside)', None: ''}
    rows.append(f'| `Role.{role.name}` | {role.meaning}{loss[role.loss]} | '
                f'{held} | {writer} | {pieces(role.read_by)} | '
                f'{role.freed.name} |')
  return rows


def _Table(**changes):
  """A copy of the table, some roles' values replaced, checked by roles.Check
  as the real one is at import."""
  values = {r.name: (r.made_by, r.read_by, r.store, r.meaning, r.loss,
                     r.source, r.freed, r.merged) for r in Role}
  values.update(changes)
  return _Copy('Table', values)


class _Copy(enum.Enum):
  """A table of roles with Role's attributes (made_by, read_by, ...)."""

  def __init__(self, *value):
    (self.made_by, self.read_by, self.store, self.meaning, self.loss,
     self.source, self.freed, self.merged) = value


class RolesTest(unittest.TestCase):

  def testAMisspeltRoleFailsWhereItIsWritten(self):
    with self.assertRaisesRegex(roles.UnknownRoleError, "'SAVD'.*SAVED"):
      _ = Role.SAVD
    with self.assertRaisesRegex(roles.UnknownRoleError, "'saved'"):
      roles.Tensors({'saved': ()})  # A string where a Role belongs.

  def testTheTableHoldsTogether(self):
    roles.Check(Role)  # As at import.
    roles.Check(_Table())

  def testARoleReadBeforeItIsWrittenFails(self):
    # SAVED made by the backward that reads it, not by a forward before it.
    saved = Role.SAVED
    with self.assertRaisesRegex(roles.RoleError, 'SAVED is read by B_KEEP'
                                '|SAVED is read by BW_KEEP'):
      roles.Check(_Table(SAVED=(
          frozenset({Piece.B_KEEP}), saved.read_by, saved.store,
          saved.meaning, saved.loss, saved.source, saved.freed,
          saved.merged)))
    # WCUT made by no piece at all.
    wcut = Role.WCUT
    with self.assertRaisesRegex(roles.RoleError, 'WCUT is read by W'):
      roles.Check(_Table(WCUT=(
          frozenset(), wcut.read_by, wcut.store, wcut.meaning, wcut.loss,
          wcut.source, wcut.freed, wcut.merged)))

  def testAReceivedRoleComesFromALatestOne(self):
    x = Role.X
    with self.assertRaisesRegex(roles.RoleError, 'X arrives from SAVED'):
      roles.Check(_Table(X=(x.made_by, x.read_by, x.store, x.meaning, x.loss,
                            ('SAVED', x.source[1]), x.freed, x.merged)))

  def testSignaturesAreTheTables(self):
    r = Role
    self.assertEqual(roles.Signature(Piece.B_KEEP, False),
                     ((r.SAVED, r.DY, r.DSKIP_OUT),
                      (r.DX, r.DSKIP_IN, r.WCUT)))
    # The loss inside: a forward reads the labels and makes the loss sums
    # instead of y; its backward reads no dy.
    self.assertEqual(roles.Signature(Piece.F_REMAT, True),
                     ((r.SEED, r.X, r.SKIP_IN, r.LABELS),
                      (r.PINNED, r.SKIP_OUT, r.BN, r.SUMS)))
    self.assertEqual(roles.Signature(Piece.BW_REMAT, True),
                     ((r.SEED, r.X, r.SKIP_IN, r.LABELS, r.DSKIP_OUT,
                       r.PINNED), (r.DX, r.DSKIP_IN, r.DWS)))
    self.assertEqual(roles.Signature(Piece.FB_DEFERS_W, True),
                     ((r.SEED, r.X, r.SKIP_IN, r.LABELS),
                      (r.BN, r.SUMS, r.DX, r.DSKIP_IN, r.WCUT)))
    self.assertEqual(roles.Signature(Piece.W, True), ((r.WCUT,), (r.DWS,)))
    self.assertEqual(roles.Signature(Piece.FORWARD, False),
                     ((r.SEED, r.X, r.SKIP_IN), (r.Y, r.SKIP_OUT)))

  def testEveryPieceReadsWhatAnEarlierOneMakesOrWhatArrives(self):
    for piece in Piece:
      for loss in (False, True):
        reads, _ = roles.Signature(piece, loss)
        for role in reads:
          self.assertTrue(
              role.store is Store.FEEDS or role.source or role.made_by,
              (piece, role))

  def testTensorsByRole(self):
    t = roles.Tensors({Role.X: [1, None], Role.DY: (2,)})
    self.assertEqual(t[Role.X], (1, None))
    self.assertEqual(t[Role.SAVED], ())
    self.assertEqual(t.Present(Role.DY, Role.X), [2, 1])
    self.assertEqual(t.With({Role.X: (3,)})[Role.X], (3,))
    self.assertEqual(t[Role.X], (1, None))  # Unchanged.


  def testDocsTableOfRolesIsTheTables(self):
    with open(_DOC, encoding='utf-8') as f:
      text = f.read()
    self.assertIn(_BEGIN, text)
    got = text.split(_BEGIN)[1].split(_END)[0].strip().splitlines()
    self.assertEqual(got, GlossaryRows(), '\n'.join(
        ['docs/pipeline.md should read:'] + GlossaryRows()))


if __name__ == '__main__':
  unittest.main()
