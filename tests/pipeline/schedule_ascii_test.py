"""schedule/ascii.py: the one grid renderer, laid out cell by cell."""

from absl.testing import absltest

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import ascii as ascii_lib


class GridTest(absltest.TestCase):

  def testCellsPaddedToTheWidestIdleAsDots(self):
    self.assertEqual(ascii_lib.Grid([['F0', None, 'BW0'], [None, 'F0']]),
                     'dev 0: F0  ..  BW0\ndev 1: ..  F0')

  def testOneCharacterCellsWithoutSeparator(self):
    self.assertEqual(ascii_lib.Grid([list('01 a'), list(' 0a ')], idle=' ',
                                    separator=''),
                     'dev 0: 01 a\ndev 1:  0a')

  def testDeviceNumbersAligned(self):
    rows = ascii_lib.Grid([['F0']] * 11).splitlines()
    self.assertEqual((rows[0], rows[10]), ('dev  0: F0', 'dev 10: F0'))

  def testScheduleTablesAreDrawnByIt(self):
    sched = schedule_lib.Make('1f1b', 2, 2)
    clocks = sched.Clocks()
    rows = [[None if clocks[t][d] is None else clocks[t][d].label
             for t in range(len(clocks))] for d in range(2)]
    self.assertEqual(sched.ToAscii(), ascii_lib.Grid(rows))


if __name__ == '__main__':
  absltest.main()
