"""Pins the behaviour the engine relies on in each TensorFlow internal it uses (tf_internals.py).

A TensorFlow upgrade that changes one of these fails here, with the API in
the test's name, before it shows as a wrong gradient or a lost memory bound.
"""

import gc

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.pipeline import tf_internals


class TfInternalsTest(tf.test.TestCase):

  def testWrapFunctionPrunesBetweenAnyTensorsAndKeepsNoneOutputs(self):
    def _Fn(x):
      h = tf.tanh(x)
      return (h * 2.0, None)

    wrapped = tf_internals.WrapFunction(_Fn, [tf.TensorSpec([3], tf.float32)])
    h, none = wrapped.structured_outputs
    self.assertIsNone(none)
    inner = h.op.inputs[0]  # tanh(x), fed directly below.
    pruned = wrapped.prune(feeds=[inner], fetches=[h])
    (out,) = pruned(tf.constant([1.0, 2.0, 3.0]))
    self.assertAllClose(out, [2.0, 4.0, 6.0])

  def testReplaceInputRewiresABuiltOp(self):
    graph = tf.Graph()
    with graph.as_default():
      a, b = tf.constant(1.0), tf.constant(5.0)
      y = tf.add(a, tf.constant(2.0))
      tf_internals.ReplaceInput(y.op, 0, b)
      self.assertIs(y.op.inputs[0], b)
      with tf.compat.v1.Session(graph=graph) as sess:
        self.assertEqual(sess.run(y), 7.0)

  def testNoAutomaticControlDependenciesTogglesThePrivateFlag(self):
    seen = []

    @tf.function
    def _Fn():
      graph = tf.compat.v1.get_default_graph()
      self.assertTrue(hasattr(graph, '_add_control_dependencies'),
                      'tf.function graphs no longer have the private '
                      '_add_control_dependencies: update '
                      'tf_internals.NoAutomaticControlDependencies')
      before = graph._add_control_dependencies  # pylint: disable=protected-access
      with tf_internals.NoAutomaticControlDependencies(graph):
        seen.append(graph._add_control_dependencies)  # pylint: disable=protected-access
      seen.append(graph._add_control_dependencies == before)  # pylint: disable=protected-access
      return tf.constant(0)

    _Fn.get_concrete_function()
    self.assertEqual(seen, [False, True])

  def testShapeUnknownLoosensAStaticShape(self):
    @tf.function
    def _Fn():
      x = tf_internals.ShapeUnknown(tf.zeros([2, 3]), [None, None])
      self.assertEqual(x.shape.as_list(), [None, None])
      return x

    self.assertAllEqual(_Fn(), tf.zeros([2, 3]))

  def testTensorListItemsRoundTripWithStaticShapes(self):
    @tf.function
    def _Fn():
      handle = tf_internals.ListReserve(tf.float32, 3)
      handle = tf_internals.ListSetItem(handle, 1, tf.ones([2, 5]))
      item = tf_internals.ListGetItem(handle, 1,
                                      tf.TensorSpec([None, 5], tf.float32))
      self.assertEqual(item.shape.as_list(), [None, 5])
      return item

    self.assertAllEqual(_Fn(), tf.ones([2, 5]))

  def testConstIsMadeOncePerGraphAndDeviceWithoutControlInputs(self):
    # Reads the graph's private device and colocation stacks.
    seen = {}

    @tf.function
    def _Fn(x):
      with tf.control_dependencies([x]):
        first = tf_internals.Const(3, tf.int32)
      seen['first'] = first
      seen['again'] = tf_internals.Index(3)
      seen['other'] = tf_internals.Const([3], tf.int32)
      with tf.device('/device:CPU:1'):
        seen['device'] = tf_internals.Const(3, tf.int32)
      seen['empty'] = [tf_internals.Const(np.zeros([0, 2]), tf.float32)
                       for _ in range(2)]
      return first + 1

    self.assertEqual(_Fn.get_concrete_function(
        tf.TensorSpec([], tf.float32)).structured_outputs.dtype, tf.int32)
    self.assertIs(seen['again'], seen['first'])
    self.assertIsNot(seen['other'], seen['first'])
    self.assertIsNot(seen['device'], seen['first'])
    self.assertIn('CPU:1', seen['device'].device)
    self.assertIs(seen['empty'][0], seen['empty'][1])
    self.assertEqual(seen['first'].op.control_inputs, [])
    self.assertEqual(self.evaluate(_Fn(tf.constant(1.0))), 4)
    # Another graph, another constant.
    with tf.Graph().as_default():
      self.assertIsNot(tf_internals.Const(3, tf.int32), seen['first'])
    self.assertEqual(tf_internals.Index(tf.constant(2)).numpy(), 2)

  def testMarkUsedSilencesAnUnreadTensorArray(self):
    # Eagerly (PipelineModel.fit's first call, a user debugging), every
    # TensorArray a write returns is wrapped; one collected unread logs an
    # error with a stack trace.
    def _Unread(mark):
      written = tf.TensorArray(tf.float32, size=2).write(0, 1.0)
      # Reading any attribute of the wrapper marks it: ask its type.
      self.assertTrue(hasattr(type(written), 'mark_used'),
                      'TensorArray.write no longer returns a tf_should_use '
                      'wrapper: tf_internals.MarkUsed may go')
      if mark:
        self.assertIs(tf_internals.MarkUsed(written), written)

    with self.assertLogs('tensorflow', level='ERROR'):
      _Unread(mark=False)
      gc.collect()
    with self.assertNoLogs('tensorflow', level='ERROR'):
      _Unread(mark=True)
      gc.collect()


if __name__ == '__main__':
  tf.test.main()
