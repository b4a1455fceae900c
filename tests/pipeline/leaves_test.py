"""Flat lists with None leaves (leaves.py); pure Python."""

import unittest

from gpipe_tf.pipeline import leaves


class LeavesTest(unittest.TestCase):

  def testFillPutsValuesBackAtTheirPlaces(self):
    flat = ['a', None, 'b', None]
    self.assertEqual(leaves.Present(flat), ['a', 'b'])
    self.assertEqual(leaves.Fill(flat, [1, 2]), [1, None, 2, None])
    self.assertEqual(leaves.Fill(flat, leaves.Present(flat)), flat)
    self.assertEqual(leaves.Fill([], []), [])

  def testFillRefusesTheWrongNumberOfValues(self):
    with self.assertRaisesRegex(ValueError, 'fewer'):
      leaves.Fill(['a', None, 'b'], [1])
    with self.assertRaisesRegex(ValueError, 'more'):
      leaves.Fill(['a', None], [1, 2])

  def testFillEachFillsTheTemplatesInTurn(self):
    self.assertEqual(leaves.FillEach([['a', None], [], [None, 'b', 'c']],
                                     [1, 2, 3]),
                     [[1, None], [], [None, 2, 3]])
    with self.assertRaisesRegex(ValueError, 'fewer'):
      leaves.FillEach([['a'], ['b']], [1])
    with self.assertRaisesRegex(ValueError, 'more'):
      leaves.FillEach([['a'], [None]], [1, 2])


if __name__ == '__main__':
  unittest.main()
