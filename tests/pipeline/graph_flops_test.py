"""graph_flops: the FLOPs of matrix products and convolutions in a traced graph, inside shared layer traces too."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import shared_run
from gpipe_tf.pipeline import graph_flops


def _Flops(fn, *specs):
  return graph_flops.Flops(
      tf.function(fn).get_concrete_function(*specs).graph)


def _Spec(*shape):
  return tf.TensorSpec(shape, tf.float32)


class FlopsTest(tf.test.TestCase):

  def testMatrixProducts(self):
    self.assertEqual(_Flops(tf.matmul, _Spec(8, 32), _Spec(32, 4)),
                     2 * 8 * 32 * 4)
    self.assertEqual(
        _Flops(lambda a, b: tf.matmul(a, b, transpose_a=True),
               _Spec(32, 8), _Spec(32, 4)), 2 * 8 * 32 * 4)
    self.assertEqual(_Flops(tf.matmul, _Spec(3, 8, 32), _Spec(3, 32, 4)),
                     2 * 3 * 8 * 32 * 4)
    self.assertEqual(
        _Flops(lambda a, b: tf.matmul(a, b, adjoint_a=True),
               _Spec(3, 32, 8), _Spec(3, 32, 4)), 2 * 3 * 8 * 32 * 4)
    self.assertEqual(
        _Flops(lambda a, b: tf.einsum('btd,dh->bth', a, b),
               _Spec(2, 5, 16), _Spec(16, 7)), 2 * 2 * 5 * 16 * 7)

  def testConvolutionsAndTheirGradients(self):
    x, k = _Spec(2, 8, 8, 3), _Spec(3, 3, 3, 5)
    forward = 2 * (2 * 8 * 8 * 5) * (3 * 3 * 3)
    conv = lambda x, k: tf.nn.conv2d(x, k, 1, 'SAME')
    self.assertEqual(_Flops(conv, x, k), forward)

    def _Grads(x, k):
      with tf.GradientTape() as tape:
        tape.watch([x, k])
        y = conv(x, k)
      return tape.gradient(y, [x, k])

    self.assertEqual(_Flops(_Grads, x, k), 3 * forward)
    depthwise = lambda x, k: tf.nn.depthwise_conv2d(x, k, [1] * 4, 'SAME')
    self.assertEqual(_Flops(depthwise, x, _Spec(3, 3, 3, 1)),
                     2 * (2 * 8 * 8 * 3) * (3 * 3))

  def testElementwiseOpsAndUnknownShapesCountNothing(self):
    self.assertEqual(_Flops(lambda a: tf.nn.relu(a) * 2.0 + a,
                            _Spec(64, 64)), 0)
    self.assertEqual(_Flops(tf.matmul, _Spec(None, 32), _Spec(32, 4)), 0)

  def testSharedLayerTracesAreCountedInside(self):
    """Identical FC layers called one by one call one shared trace per
    layer: each call counts its trace's matmul."""
    net = core.SequentialLayer.Params().Set(name='net', layers=[
        core.FCLayer.Params().Set(name=f'fc{i}', input_dim=16, output_dim=16)
        for i in range(3)]).Instantiate()
    with shared_run.NoRuns():  # Not one loop over the run.
      graph = tf.function(
          lambda x: net.FProp(x, training=True)).get_concrete_function(
              _Spec(4, 16)).graph
    calls = [op for op in graph.get_operations()
             if op.type in ('PartitionedCall', 'StatefulPartitionedCall')]
    self.assertLen(calls, 3)  # Not inlined yet: the FLOPs are inside.
    self.assertEqual(graph_flops.Flops(graph), 3 * 2 * 4 * 16 * 16)


if __name__ == '__main__':
  tf.test.main()
