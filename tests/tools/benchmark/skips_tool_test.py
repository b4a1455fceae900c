"""tools.benchmark.skips: the benchmark's rows on a tiny U-Net: stash/pop receives less on the middle devices than tuple carrying, and the table shows every row."""

import test_utils  # pylint: disable=g-bad-import-order

DEVICES = test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools.benchmark import skips  # pylint: disable=g-import-not-at-top


class _Workers:
  """Stands in for local_workers.LocalWorkers: its devices' allocators
  answer peaks of 1, 2, 3 ... MiB above 10 MiB, device d's step i at
  (i + 1) * (d + 1) MiB."""

  def __init__(self, k):
    self.k, self.steps = k, 0

  def Memory(self, reset=False):
    if reset:
      self.steps += 1
      return [dict(current=10 * 2**20, peak=10 * 2**20)] * self.k
    return [dict(current=0, peak=10 * 2**20 + self.steps * (d + 1) * 2**20)
            for d in range(self.k)]


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
      self.assertEqual(row['device_peaks'], [])
      row['times'].append(0.01)
    table = skips.Table(rows)
    self.assertIn('| 1f1b | stash/pop | [5, 4, 4, 4] |', table)
    self.assertIn('| 1f1b | tuple | [5, 4, 4, 4] |', table)
    self.assertNotIn('peak dev', table)

  def testEachDevicesPeakFromItsOwnAllocator(self):
    # --skips_devices=processes reads every worker's allocator: per device
    # the median of three steps' peaks, the row's peak their sum.
    model = skips.UNet(size=8, width=2)
    row = skips.Measure(model, True, 'gpipe', 2, 2, 4, 'never', DEVICES,
                        [9, 8], workers=_Workers(2))
    self.assertEqual(row['device_peaks'], [2 * 2**20, 4 * 2**20])
    self.assertEqual(row['peaks'], [3 * 2**20, 6 * 2**20, 9 * 2**20])
    self.assertEqual(row['peak_bytes'], 6 * 2**20)
    row['times'].append(0.01)
    table = skips.Table([row])
    self.assertIn('| peak dev 0 MiB | peak dev 1 MiB | peak step MiB, sum '
                  'of devices (min-max of 3) |', table)
    self.assertIn('| 2.00 | 4.00 | 6.00 (3.00-9.00) |', table)


if __name__ == '__main__':
  tf.test.main()
