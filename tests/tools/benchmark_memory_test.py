"""Tests for tools/benchmark_memory.py: the sizes a traced pipelined step's stages hold."""

import tensorflow as tf

from gpipe_tf.runtime import devices as devices_lib
from tools import benchmark_lib as lib
from tools import benchmark_memory


class BytesTest(tf.test.TestCase):

  def testAViewOfABufferCountsOnce(self):
    sizes = {}

    @tf.function
    def _Graph(unknown):
      x = tf.zeros([4, 6])
      y = tf.reshape(x, [24])
      z = x * 2.0
      sizes['viewed'] = benchmark_memory._Bytes([x, y, z])
      sizes['excluded'] = benchmark_memory._Bytes(
          [y, z], frozenset([id(x)]))
      sizes['unknown'] = benchmark_memory._Bytes([z, unknown])
      return z

    _Graph.get_concrete_function(tf.TensorSpec([None, 6]))
    self.assertEqual(sizes['viewed'], 2 * 24 * 4)
    self.assertEqual(sizes['excluded'], 24 * 4)
    self.assertIsNone(sizes['unknown'])


class TracedStageBytesTest(tf.test.TestCase):

  def testFCStagesHoldTheirLayersOutputs(self):
    # 4 FC-8 blocks (ReLU), K=2: stage 0 is blocks 0-1. Its backward reads
    # its input x (counted as input, not twice), block 0's output (block
    # 1's input and ReLU's gradient) and block 1's output (ReLU's
    # gradient): two outputs of 8 values per example, 8 examples a
    # micro-batch.
    spec = lib.ModelSpec(num_blocks=4, dim=8, batch_size=16)
    cfg = lib.Config(True, 2, 2, 'never', schedule='1f1b', loss_inside=True)
    step, model = lib.StepAndModel(spec, cfg,
                                   devices_lib.DefaultDevices()[:2])
    self.assertIsNone(benchmark_memory.TracedStageBytes(model.cells))
    step()
    stages = benchmark_memory.TracedStageBytes(model.cells)
    self.assertLen(stages, 2)
    first = stages[0]
    self.assertEqual(first.input, 8 * 8 * 4)
    self.assertEqual(first.activations, 2 * 8 * 8 * 4)
    self.assertEqual(first.gradients, 2 * (8 * 8 + 8) * 4)
    self.assertEqual(first.weights, first.gradients)
    self.assertEqual(first.pinned, 0)
    self.assertGreater(stages[1].activations, 0)
    # The model over these sizes: GPipe holds every micro-batch's.
    gpipe = lib.ModelPeakBytes(spec, lib.Config(
        True, 2, 2, 'never', schedule='gpipe', loss_inside=True), stages)
    self.assertGreaterEqual(
        gpipe, 2 * (first.input + first.activations) + first.gradients)


if __name__ == '__main__':
  tf.test.main()
