"""gpipe_tf/pipeline/layer_bytes.py: what each layer's backward keeps, from a trace of its training step."""

from unittest import mock

import tensorflow as tf

from gpipe_tf import layers
from gpipe_tf.layers import core
from gpipe_tf.layers import precision
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import layer_bytes


def _FC(i):
  return layers.FCLayer.Params().Set(name=f'fc{i}', input_dim=8, output_dim=8,
                                     activation='RELU')


class KeptBytesTest(tf.test.TestCase):

  def testAnFCLayerKeepsItsOutputAndHandsItsInputAndGradientToW(self):
    # Its backward reads its input (counted where it was made) and its
    # ReLU output: 8 floats an example; its W reads the input and the
    # output's gradient: 16. The two identical layers are traced once.
    with mock.patch.object(layer_bytes, '_Trace',
                           wraps=layer_bytes._Trace) as trace:
      kept = layer_bytes.KeptBytes([_FC(0), _FC(1)], [(None, 8)])
    self.assertEqual(kept, [(32, 64), (32, 64)])
    self.assertEqual(trace.call_count, 1)

  def testATransformerBlockKeepsFarMoreThanItsOutput(self):
    block = layers.TransformerEncoderLayer.Params().Set(
        name='block', model_dim=8, hidden_dim=32, num_heads=2)
    shapes = [(None, 4, 8), (None, 4)]
    (kept, wcut), = layer_bytes.KeptBytes([block], shapes)
    output = 4 * 8 * 4  # Its output per example: 4 positions x 8 floats.
    self.assertGreater(kept, 10 * output)
    self.assertGreater(wcut, output)

  def testSkipLayersAndTheLayerAfterAStashAreTraced(self):
    # 'c' takes the stasher's outputs less the stashed copy (one 8-wide
    # input, not two); the stasher and the popper trace as cells with a
    # skip_out / skip_in and keep nothing; 'd' reads the 16-wide concat.
    fc = lambda n, i, o: _FC(0).Set(name=n, input_dim=i, output_dim=o)
    stack = [fc('a', 8, 8), core.BranchLayer.Params().Set(
        name='b', stash=('s',)), fc('c', 8, 8), core.MergeLayer.Params().Set(
            name='m', pop=('s',), op='concat'), fc('d', 16, 8)]
    self.assertEqual(layer_bytes.KeptBytes(stack, [(None, 8)]),
                     [(32, 64), (0, 0), (32, 64), (0, 0), (32, 96)])

  def testA16BitPolicyKeepsHalfTheBytes(self):
    # Traced in the policy, on bfloat16 inputs: 2 bytes a value.
    self.assertEqual(
        layer_bytes.KeptBytes([_FC(0)], [(None, 8)], policy='mixed_bfloat16'),
        [(16, 32)])
    with self.assertRaises(precision.PolicyError):
      layer_bytes.KeptBytes([_FC(0)], [(None, 8)], policy='float8')

  def testASoftmaxOverLabelsIsTraced(self):
    # Its W's cut holds the broadcast gradient's axes, int vectors of no
    # static length: shape arithmetic, counted 0, not a size unknown. Its
    # backward reads only its input (kept 0 beyond it); its W reads the
    # input and the logits' gradient: 4 positions x (8 + 16) floats.
    softmax = layers.SoftmaxLayer.Params().Set(name='sm', input_dim=8,
                                               num_classes=16)
    self.assertEqual(
        layer_bytes.KeptBytes([softmax], [(None, 4, 8), (None, 4)]),
        [(0, 4 * (8 + 16) * 4)])

  def testALayerTheTraceCannotBuildKeepsTheEstimate(self):
    # An embedding reads integer ids; the trace feeds floats of the shapes.
    embedding = layers.EmbeddingLayer.Params().Set(
        name='emb', vocab_size=10, embedding_dim=8)
    self.assertEqual(layer_bytes.KeptBytes([embedding], [(None, 4)]), [None])


def _StageBytes(stack, shapes, batch=2):
  """(kept, wcut) per example of `stack` traced whole as one cell."""
  specs = [tf.TensorSpec([batch] + [int(d or 1) for d in s[1:]])
           for s in shapes]
  stage = introspect.ProgramBytes(introspect.TraceCell(
      [lp.Copy().Instantiate() for lp in stack], specs))
  return stage.activations / batch, stage.wcut / batch


def _Summed(stack, shapes):
  """(kept, wcut) per example of `stack` from its layers: KeptBytes, and
  JoinedBytes of every layer after the first."""
  kept = layer_bytes.KeptBytes(stack, shapes)
  joined = layer_bytes.JoinedBytes(stack, shapes)
  return tuple(sum(k[i] for k in kept) + sum(j[i] for j in joined[1:])
               for i in (0, 1))


class JoinedBytesTest(tf.test.TestCase):

  def testTransformerBlocksSumToTheirStage(self):
    # A block's output is a residual sum, which no backward reads, so its
    # own trace keeps none of it; the next block's backward reads it as
    # its input, which that block's trace leaves out: one block input (4
    # positions x 8 floats) an example per later block, exactly.
    blocks = [layers.TransformerEncoderLayer.Params().Set(
        name=f'block{i}', model_dim=8, hidden_dim=32, num_heads=2)
              for i in range(4)]
    shapes = [(None, 4, 8), (None, 4)]
    joined = layer_bytes.JoinedBytes(blocks, shapes)
    self.assertEqual(joined, [None] + [(4 * 8 * 4, 0)] * 3)
    self.assertEqual(_Summed(blocks, shapes), _StageBytes(blocks, shapes))

  def testFCLayersJoinWithNothing(self):
    # The ReLU output each layer keeps is the next one's input: counted once.
    stack = [_FC(i) for i in range(4)]
    self.assertEqual(layer_bytes.JoinedBytes(stack, [(None, 8)]),
                     [None, (0, 0), (0, 0), (0, 0)])
    self.assertEqual(_Summed(stack, [(None, 8)]),
                     _StageBytes(stack, [(None, 8)]))

  def testEachDistinctPairIsTracedOnce(self):
    with mock.patch.object(layer_bytes, '_Trace',
                           wraps=layer_bytes._Trace) as trace:
      layer_bytes.JoinedBytes([_FC(i) for i in range(5)], [(None, 8)])
    self.assertEqual(trace.call_count, 2)  # One layer alone, one pair.

  def testSkipLayersAndUntracedLayersJoinWithNone(self):
    fc = lambda n: _FC(0).Set(name=n)
    stack = [fc('a'), core.BranchLayer.Params().Set(name='b', stash=('s',)),
             fc('c'), core.MergeLayer.Params().Set(name='m', pop=('s',),
                                                   op='concat')]
    self.assertEqual(layer_bytes.JoinedBytes(stack, [(None, 8)]),
                     [None] * 4)
    embedding = layers.EmbeddingLayer.Params().Set(
        name='emb', vocab_size=10, embedding_dim=8)
    self.assertEqual(
        layer_bytes.JoinedBytes([embedding, fc('a').Set(input_dim=8)],
                                [(None, 4)]), [None, None])


class BenchmarkStacksTest(tf.test.TestCase):
  """tools.benchmark's block stacks, as its K=2 rows split 8 Transformer
  blocks and 32 FC layers, at their own sizes: a stage's bytes summed from
  its layers equal the stage traced whole, to the byte."""

  def testTheStagesOfBothBenchmarkModels(self):
    from tools.benchmark import lib as bench_lib  # pylint: disable=g-import-not-at-top
    for block, n in (('transformer', 4), ('fc', 16)):
      with self.subTest(block=block):
        stack, shapes = bench_lib.LayersOf(
            bench_lib.ModelSpec(block=block, num_blocks=n))
        self.assertEqual(_Summed(stack, shapes), _StageBytes(stack, shapes))


if __name__ == '__main__':
  tf.test.main()
