"""Tests for gpipe_tf/pipeline/introspect.py: what tools read from a traced step."""

import test_utils  # pylint: disable=g-bad-import-order,unused-import

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import layers
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline.schedule import action
from gpipe_tf.pipeline.schedule import ticks

R = roles.Role


def _Fc(i, d=8):
  return layers.FCLayer.Params().Set(name=f'block{i}', input_dim=d,
                                     output_dim=d, activation='RELU')


class BytesTest(tf.test.TestCase):

  def testAViewOfABufferCountsOnce(self):
    sizes = {}

    @tf.function
    def _Graph(unknown):
      x = tf.zeros([4, 6])
      y = tf.reshape(x, [24])
      z = x * 2.0
      sizes['viewed'] = introspect._Bytes([x, y, z])
      sizes['excluded'] = introspect._Bytes([y, z],
                                            frozenset([introspect._Buffer(x)]))
      sizes['unknown'] = introspect._Bytes([z, unknown])
      return z

    _Graph.get_concrete_function(tf.TensorSpec([None, 6]))
    self.assertEqual(sizes['viewed'], 2 * 24 * 4)
    self.assertEqual(sizes['excluded'], 24 * 4)
    self.assertIsNone(sizes['unknown'])


  def testSharedLayerTracesKeepWhatLayersTracedAloneKeep(self):
    """A shared trace's call returns views of its inputs and of its own
    outputs among a block's saved tensors: followed into the call, each
    buffer counts once, and a cell keeps the same bytes shared or not."""
    blocks = [layers.TransformerEncoderLayer.Params().Set(
        name=f'b{i}', model_dim=16, hidden_dim=32, num_heads=2).Instantiate()
              for i in range(3)]
    specs = [tf.TensorSpec([4, 8, 16], tf.float32),
             tf.TensorSpec([4, 8], tf.float32)]
    shared_trace.Stats.Reset()
    shared = introspect.ProgramBytes(introspect.TraceCell(blocks, specs))
    self.assertGreater(shared_trace.Stats.Get().calls, 0)
    with shared_trace.Off():
      alone = introspect.ProgramBytes(introspect.TraceCell(blocks, specs))
    self.assertEqual(shared, alone)


class TracedStageBytesTest(tf.test.TestCase):

  def testFCStagesHoldTheirLayersOutputs(self):
    # 4 FC-8 blocks (ReLU), K=2, M=2 of 16 examples: stage 0 is blocks 0-1.
    # Its backward reads its input x (counted as input, not twice), block
    # 0's output and block 1's output: two outputs of 8 values per example,
    # 8 examples a micro-batch.
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=[_Fc(i) for i in range(4)], num_partitions=2,
        num_micro_batches=2, schedule='1f1b', remat='never',
        input_shapes=[(None, 8)]).Instantiate()
    x = tf.ones([16, 8])

    def _LossFn(logits, y):
      del y
      return loss_lib.LossTerms(tf.reduce_mean(tf.square(logits), axis=1))

    @tf.function
    def _Step():
      return pipe.ComputeLossAndGradients(x, tf.zeros([16]), _LossFn)[0]

    self.assertIsNone(introspect.TrainingPrograms(pipe.cells))
    self.assertIsNone(introspect.TracedStageBytes(pipe.cells))
    _Step()
    self.assertLen(introspect.TrainingPrograms(pipe.cells), 2)
    stages = introspect.TracedStageBytes(pipe.cells)
    self.assertLen(stages, 2)
    first = stages[0]
    self.assertEqual(first.input, 8 * 8 * 4)
    self.assertEqual(first.activations, 2 * 8 * 8 * 4)
    self.assertEqual(first.gradients, 2 * (8 * 8 + 8) * 4)
    self.assertEqual(first.weights, first.gradients)
    self.assertEqual(first.pinned, 0)
    self.assertGreater(stages[1].activations, 0)


class TraceCellTest(tf.test.TestCase):

  def testPiecesMakeTheirRolesAndTheSizesAreOneLayersOutput(self):
    layer = _Fc(0).Instantiate()
    program = introspect.TraceCell([layer], [tf.TensorSpec([2, 8])])
    # Kept forward: the ReLU output (8 floats an example); W: the input and
    # the output's gradient.
    stage = introspect.ProgramBytes(program)
    self.assertEqual(stage.activations, 2 * 8 * 4)
    self.assertEqual(stage.wcut, 2 * 2 * 8 * 4)
    self.assertEqual(stage.weights, (8 * 8 + 8) * 4)
    f = program.Piece(ticks.Step(action.F, 0, keep=True))
    self.assertIn(R.Y, f.makes)
    x = roles.Tensors({R.SEED: (tf.constant([1, 2], tf.int64),),
                       R.X: (tf.ones([2, 8]),)})
    y, = f(x)[R.Y]
    self.assertAllClose(y, layer.FProp(tf.ones([2, 8])))


class FindActionScopeTest(tf.test.TestCase):

  def testReadsWhatTheEngineWrites(self):
    step = ticks.Step(action.BW, 3)
    at_tick = f'a/{ticks.Scope(step, micro_batch=6)}/MatMul'
    found = introspect.FindActionScope(at_tick)
    self.assertEqual((found.name, found.stage, found.kind, found.micro_batch,
                      found.column), ('stage3_BW_mb6', 3, 'BW', 6, None))
    self.assertEqual(at_tick[found.end:], 'MatMul')
    in_loop = introspect.FindActionScope(
        f'{ticks.Scope(step, column=11)}/x/y')
    self.assertEqual((in_loop.micro_batch, in_loop.column), (None, 11))
    self.assertIsNone(introspect.FindActionScope(
        f'while/{ticks.Scope(step)}/MatMul'))  # A switch branch: no action.
    self.assertIsNone(introspect.FindActionScope('stage3_BW_mb6'))
    # A step scope inside a scope that names no action.
    nested = introspect.FindActionScope(
        f'{ticks.Scope(step)}/{ticks.Scope(step, column=2)}/x')
    self.assertEqual((nested.name, nested.column), ('stage3_BW_t2', 2))


if __name__ == '__main__':
  tf.test.main()
