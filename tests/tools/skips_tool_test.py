"""tools.skips: the benchmark's rows on a tiny U-Net: stash/pop receives less on the middle devices than tuple carrying, and the table shows every row."""

import test_utils  # pylint: disable=g-bad-import-order

DEVICES = test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools import skips  # pylint: disable=g-import-not-at-top


class SkipsToolTest(tf.test.TestCase):

  def testStashPopReceivesLessInTheMiddle(self):
    model = skips.UNet(size=8, width=2)
    rows = [skips.Measure(model, stash, '1f1b', 4, 2, 4, 'never', DEVICES,
                          [5, 4, 4, 4]) for stash in (True, False)]
    stash, carry = rows[0]['received'], rows[1]['received']
    self.assertEqual((stash[0], stash[3]), (carry[0], carry[3]))
    self.assertLess(stash[1], carry[1])
    self.assertLess(stash[2], carry[2])
    # Device 1 (stash/pop): cell 0's output, 2 x 2 x 8 floats an example,
    # and the gradient of its own, 2 x 2 x 24 (the bottom's 16 channels up
    # and the 8 of down2 beside them), for 4 examples.
    self.assertEqual(stash[1], 4 * 4 * (2 * 2 * 8 + 2 * 2 * 24))
    for row in rows:
      self.assertGreater(row['peak_bytes'], 0)
      row['times'].append(0.01)
    table = skips.Table(rows)
    self.assertIn('| 1f1b | stash/pop | [5, 4, 4, 4] |', table)
    self.assertIn('| 1f1b | tuple | [5, 4, 4, 4] |', table)


if __name__ == '__main__':
  tf.test.main()
