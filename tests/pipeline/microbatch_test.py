"""Micro-batch split and merge: sizes, order, nests, unknown batch sizes."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.pipeline import microbatch


class MicroBatchTest(tf.test.TestCase):

  def testSizesNeverDropExamples(self):
    self.assertEqual(microbatch.MicroBatchSizes(10, 4), [3, 3, 2, 2])
    self.assertEqual(microbatch.MicroBatchSizes(8, 8), [1] * 8)
    for n in range(1, 40):
      for m in range(1, n + 1):
        sizes = microbatch.MicroBatchSizes(n, m)
        self.assertLen(sizes, m)
        self.assertEqual(sum(sizes), n)
        self.assertLessEqual(max(sizes) - min(sizes), 1)
        self.assertEqual(sizes, sorted(sizes, reverse=True))

  def testErrors(self):
    with self.assertRaisesRegex(microbatch.MicroBatchError, '<= 2'):
      microbatch.MicroBatchSizes(2, 3)
    with self.assertRaisesRegex(microbatch.MicroBatchError, '>= 1'):
      microbatch.MicroBatchSizes(2, 0)
    with self.assertRaisesRegex(microbatch.MicroBatchError, 'disagree'):
      microbatch.Split([tf.ones([4, 2]), tf.ones([5])], 2)

  def testSplitMergeRoundTripWithScalarsAndInts(self):
    x = tf.reshape(tf.range(30.0), [10, 3])
    ids = tf.range(10)
    scalar = tf.constant(2.0)
    micro = microbatch.Split([x, ids, scalar, None], 3)
    self.assertLen(micro, 3)
    self.assertEqual([int(mb[0].shape[0]) for mb in micro], [4, 3, 3])
    self.assertAllEqual(micro[1][1], [4, 5, 6])
    self.assertIs(micro[2][2], scalar)
    self.assertIsNone(micro[0][3])
    merged = microbatch.Merge([mb[:2] for mb in micro])
    self.assertAllEqual(merged[0], x)
    self.assertAllEqual(merged[1], ids)

  def testUnknownBatchSize(self):

    @tf.function(input_signature=[tf.TensorSpec([None, 2])])
    def _RoundTrip(x):
      micro = microbatch.Split([x], 4)
      self.assertIsNone(micro[0][0].shape[0])
      sizes = tf.stack([tf.shape(mb[0])[0] for mb in micro])
      return microbatch.Merge(micro)[0], sizes

    x = tf.reshape(tf.range(22.0), [11, 2])
    merged, sizes = _RoundTrip(x)
    self.assertAllEqual(merged, x)
    self.assertAllEqual(sizes, [3, 3, 3, 2])

  def testSplitLikeFollowsSizes(self):
    micro = microbatch.Split([tf.ones([7, 2])], 3)
    parts = microbatch.SplitLike([tf.reshape(tf.range(14.0), [7, 2]), None],
                                 [mb + [None] for mb in micro])
    self.assertEqual([int(p[0].shape[0]) for p in parts], [3, 2, 2])
    self.assertIsNone(parts[0][1])


if __name__ == '__main__':
  tf.test.main()
