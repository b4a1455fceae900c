"""tools/plan/block.py: the --synthesize_table block at a chosen size, bytes traced, times measured or scaled by FLOPs."""

import dataclasses
from unittest import mock

from absl.testing import absltest

from gpipe_tf.pipeline import layer_bytes
from gpipe_tf.pipeline.schedule import memory
from tools.plan import block as plan_block
from tools.plan import lib as plan_lib

# A block small enough to trace in a second.
_TINY = plan_block.BlockSize(width=8, tokens=4, heads=2, hidden=32,
                             micro_batch=2)


class BlockSizeTest(absltest.TestCase):

  def testTheDefaultIsTheBenchmarkBlock(self):
    from tools.benchmark import lib as bench_lib  # pylint: disable=g-import-not-at-top
    blocks, shapes = bench_lib.LayersOf(
        bench_lib.ModelSpec(block='transformer', num_blocks=1))
    size = plan_block.BlockSize()
    self.assertEqual(size.Params().ToText(), blocks[0].ToText())
    self.assertEqual([tuple(s) for s in size.InputShapes()],
                     [tuple(s) for s in shapes])

  def testSizesNoBlockCanHaveAreAPlanError(self):
    with self.assertRaisesRegex(plan_lib.PlanError, '--table_heads'):
      plan_block.BlockSize(width=10, heads=4).Check()
    with self.assertRaisesRegex(plan_lib.PlanError, '--table_tokens'):
      plan_block.BlockSize(tokens=0).Check()
    with self.assertRaisesRegex(plan_lib.PlanError, '--table_micro_batch'):
      plan_block.TransformerBlock(plan_block.BlockSize(micro_batch=0))


class TransformerBlockTest(absltest.TestCase):

  def testBytesComeFromTheTrace(self):
    with mock.patch.object(layer_bytes, 'KeptBytes',
                           return_value=[(1000, 3000)]) as traced:
      block = plan_block.TransformerBlock()
    (params, shapes), _ = traced.call_args
    self.assertLen(params, 1)
    self.assertEqual([tuple(s) for s in shapes], [(None, 32, 256), (None, 32)])
    b = 8
    # Input: 32 x 256 values and a mask of 32, float32, per sequence.
    self.assertEqual(block.cost.bytes, memory.StageBytes(
        input=(32 * 256 + 32) * 4 * b, activations=1000 * b, wcut=3000 * b))
    self.assertEqual((block.kept, block.wcut), (1000, 3000))
    # The benchmark block's times are the measured ones, untouched.
    self.assertEqual((block.cost.forward, block.cost.backward,
                      block.cost.weight), plan_block.TRANSFORMER_TIMES)
    self.assertEqual(block.comm_time, plan_block.TRANSFORMER_COMM)
    self.assertIn('wcut / kept 3.000', block.Describe())
    self.assertIn('measured on the benchmark block', block.Describe())

  def testAnUntraceableBlockIsAPlanError(self):
    with mock.patch.object(layer_bytes, 'KeptBytes', return_value=[None]):
      with self.assertRaisesRegex(plan_lib.PlanError, 'could not be traced'):
        plan_block.TransformerBlock()

  def testTheRealTraceKeepsMoreThanTheBlocksOutput(self):
    block = plan_block.TransformerBlock()
    # Attention probabilities and the 4d-wide hidden layer: far over the
    # block's input (which its output's size equals); W reads more still.
    self.assertGreater(block.cost.bytes.activations,
                       10 * block.cost.bytes.input)
    self.assertGreater(block.cost.bytes.wcut, block.cost.bytes.activations)

  def testTimesScaleWithTheMicroBatch(self):
    one = plan_block.TransformerBlock(_TINY)
    two = plan_block.TransformerBlock(
        dataclasses.replace(_TINY, micro_batch=4))
    for a, b in [(one.cost.forward, two.cost.forward),
                 (one.cost.backward, two.cost.backward),
                 (one.cost.weight, two.cost.weight),
                 (one.comm_time, two.comm_time),
                 (one.cost.bytes.input, two.cost.bytes.input),
                 (one.cost.bytes.activations, two.cost.bytes.activations),
                 (one.cost.bytes.wcut, two.cost.bytes.wcut)]:
      self.assertAlmostEqual(b / a, 2.0)

  def testWeightGradientsScaleWithParametersAndTokens(self):
    small = plan_block.TransformerBlock(_TINY)
    # Twice the tokens: W's matmuls read twice the rows; F and B also
    # compute attention, which grows with the square of the tokens.
    long = plan_block.TransformerBlock(dataclasses.replace(_TINY, tokens=8))
    self.assertAlmostEqual(long.cost.weight / small.cost.weight, 2.0)
    self.assertGreater(long.cost.forward / small.cost.forward, 2.0)
    self.assertAlmostEqual(long.comm_time / small.comm_time, 2.0)
    # Against the measured benchmark block: W in proportion to parameters
    # (4 attention projections with biases, 2 layer norms, the two
    # feed-forward matmuls with biases) x tokens x sequences.
    ratio = plan_block.TRANSFORMER_TIMES[2] / small.cost.weight
    params = lambda d, h: 4 * (d * d + d) + 2 * d * h + h + d + 4 * d
    self.assertAlmostEqual(
        ratio, params(256, 1024) * 32 * 8 / (params(8, 32) * 4 * 2),
        delta=1e-9 * ratio)

  def testTheStashRatioFallsAsSequencesGrow(self):
    # Attention probabilities (h x T per token) are kept by the forward and
    # read by no W: the longer the sequence, the smaller W's stash against
    # what the forward keeps.
    short = plan_block.TransformerBlock(_TINY)
    long = plan_block.TransformerBlock(dataclasses.replace(_TINY, tokens=64))
    self.assertLess(long.wcut / long.kept, short.wcut / short.kept)
    self.assertIn('scaled by FLOPs', long.Describe())


if __name__ == '__main__':
  absltest.main()
