"""Mixed precision and XLA in the pipeline: pipelined == SequentialLayer under the same policy; loss scaling; compiled pieces."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import ticks
from gpipe_tf.train import loop
from gpipe_tf.train import runner as runner_lib
from params.synthetic import mlp

_TOLERANCE = {'float32': 1e-5, 'mixed_bfloat16': 3e-2,
              'mixed_float16': 3e-3}


def _Layers():
  layers = test_utils.MlpLayers()
  layers.insert(2, normalization.BatchNormLayer.Params().Set(name='bn',
                                                             dim=12))
  return layers


def _LossFn(logits, labels):
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(logits, labels))


def _Data():
  x = tf.random.stateless_normal([8, 6], seed=[1, 2])
  y = tf.random.stateless_uniform([8], [5, 6], 0, 5, tf.int32)
  return x, y


def _Relative(a, b):
  return float(tf.reduce_max(tf.abs(a - b)) /
               (tf.reduce_max(tf.abs(b)) + 1e-12))


class PrecisionTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.x, self.y = _Data()
    self.seq = core.SequentialLayer.Params().Set(
        name='net', layers=_Layers()).Instantiate()

  def _Reference(self, policy):
    @tf.function  # Graph-optimised like the pipeline's pieces.
    def _Step():
      with precision.Policy(policy), tf.GradientTape() as tape:
        out = self.seq.FProp(self.x, training=True)
        loss, _ = loss_lib.ReduceTerms(
            _LossFn(precision.ToFloat32(out), self.y))
      return out, loss, tape.gradient(loss, self.seq.trainable_variables)
    return _Step()

  def _Pipe(self, policy, **kw):
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Layers(), num_partitions=2, precision=policy,
        **kw).Instantiate()
    for a, b in zip(pipe.variables, self.seq.variables):
      a.assign(b)
    return pipe

  def testLayersComputeIn16BitsFromFloat32Masters(self):
    for policy, dtype in (('mixed_bfloat16', tf.bfloat16),
                          ('mixed_float16', tf.float16)):
      out, loss, grads = self._Reference(policy)
      self.assertEqual(out.dtype, dtype)
      self.assertEqual(loss.dtype, tf.float32)
      self.assertTrue(all(g.dtype == tf.float32 for g in grads))
      self.assertTrue(all(v.dtype == tf.float32 for v in self.seq.variables))
      # The float32 reference differs: the policy really changed the math.
      _, _, grads32 = self._Reference('float32')
      self.assertGreater(max(_Relative(a, b) for a, b in zip(grads, grads32)),
                         1e-5)
    with self.assertRaisesRegex(precision.PolicyError, 'mixed_bfloat16'):
      with precision.Policy('half'):
        pass
    with self.assertRaises(precision.PolicyError):
      self._Pipe('half')

  def testPipelinedEqualsSequentialUnderTheSamePolicy(self):
    # M=1: BatchNorm's batch statistics are the whole batch's, as in the
    # reference (M > 1 is the split-dependent case of the other tests).
    # Each policy with one (schedule, execution), each of the two for a
    # 16-bit policy (float32 with every schedule and execution is
    # schedule_transparency_test's and support_test's).
    configs = {'float32': ('1f1b', 'loop'),
               'mixed_bfloat16': ('zb_h1', 'unrolled'),
               'mixed_float16': ('1f1b', 'loop')}
    for policy in _TOLERANCE:
      want_out, want_loss, want = self._Reference(policy)
      for schedule, execution in (configs[policy],):
        with self.subTest(policy=policy, schedule=schedule):
          pipe = self._Pipe(policy, schedule=schedule, execution=execution)
          loss, _, got = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
              self.x, self.y, _LossFn))()
          self.assertAllClose(want_loss, loss, rtol=_TOLERANCE[policy])
          for a, b in zip(got, want):
            self.assertLess(_Relative(a, b), _TOLERANCE[policy])
      with self.subTest(policy=policy, path='tape'):
        pipe = self._Pipe(policy)
        with tf.GradientTape() as tape:
          out = pipe.FProp(self.x, training=True)
          loss, _ = loss_lib.ReduceTerms(
              _LossFn(precision.ToFloat32(out), self.y))
        self.assertEqual(out.dtype, want_out.dtype)
        for a, b in zip(tape.gradient(loss, pipe.trainable_variables), want):
          self.assertLess(_Relative(a, b), _TOLERANCE[policy])

  def testBoundaryActivationsAre16Bit(self):
    pipe = self._Pipe('mixed_bfloat16', num_micro_batches=2)
    pipe.ComputeLossAndGradients(self.x, self.y, _LossFn)
    program = list(pipe.cells[1].programs.values())[0]
    self.assertEqual(program.tensors[Role.X][0].dtype, tf.bfloat16)

  def testLossScaleScalesTheGradientsOnly(self):
    pipe = self._Pipe('mixed_float16', num_micro_batches=2, schedule='1f1b')
    loss, _, plain = pipe.ComputeLossAndGradients(self.x, self.y, _LossFn)
    scaled_loss, _, scaled = pipe.ComputeLossAndGradients(
        self.x, self.y, _LossFn, loss_scale=tf.constant(1024.0))
    self.assertAllClose(loss, scaled_loss)
    for a, b in zip(plain, scaled):
      self.assertAllClose(a * 1024.0, b, rtol=1e-3, atol=1e-3)

  def testJitCompiledPieces(self):
    pipe = self._Pipe('float32', schedule='zb_h1', num_micro_batches=2,
                      jit_compile=True)
    loss, _, got = tf.function(lambda: pipe.ComputeLossAndGradients(
        self.x, self.y, _LossFn))()
    # M=2 with batch statistics: compare with the same pipeline unjitted.
    plain = self._Pipe('float32', schedule='zb_h1', num_micro_batches=2)
    want_loss, _, want = plain.ComputeLossAndGradients(self.x, self.y,
                                                       _LossFn)
    self.assertAllClose(want_loss, loss, rtol=1e-5)
    for a, b in zip(got, want):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
    program = list(pipe.cells[0].programs.values())[0]
    piece = program.Piece(ticks.Step(ticks.F, 0, False))
    self.assertTrue(piece.function._jit_compile)  # pylint: disable=protected-access

  def testJitCompiledInference(self):
    # jit_compile applies to inference's pieces too, not only training's.
    pipe = self._Pipe('float32', num_micro_batches=2, jit_compile=True)
    got = tf.function(lambda: pipe.FProp(self.x, training=False))()
    want = self._Pipe('float32', num_micro_batches=2).FProp(self.x,
                                                            training=False)
    self.assertAllClose(want, got, rtol=1e-5, atol=1e-6)
    for cell in pipe.cells:
      (program,) = cell.programs.values()
      self.assertFalse(program.training)
      piece = program.Piece(ticks.Step(ticks.F, 0, True))
      self.assertTrue(piece.function._jit_compile)  # pylint: disable=protected-access


class TrainerPrecisionTest(tf.test.TestCase):

  def testTrainsWithEachPolicy(self):
    for policy in ('mixed_bfloat16', 'mixed_float16'):
      with self.subTest(policy=policy):
        logdir = self.get_temp_dir() + '/' + policy
        result = loop.train_and_evaluate(
            mlp.TinyPipelined, logdir, 'train', max_steps=4,
            precision=policy)
        self.assertEqual(result.global_step, 4)
        self.assertEqual(result.skipped_steps, 0)
        self.assertTrue(all(tf.math.is_finite(v)
                            for v in result.train_metrics.values()))
    with self.assertRaises(precision.PolicyError):
      loop.train_and_evaluate(mlp.TinyPipelined,
                              self.get_temp_dir() + '/half', 'train',
                              max_steps=1, precision='half')

  def testFloat16OverflowIsSkippedAndTheScaleDrops(self):
    runner = runner_lib.Runner(mlp.TinyPipelined,
                               self.get_temp_dir() + '/f16', 1,
                               precision_policy='mixed_float16')
    self.assertIsInstance(runner.optimizer,
                          keras.optimizers.LossScaleOptimizer)
    runner.optimizer.dynamic_scale.assign(2.0**60)  # Overflows float16.
    batch = next(iter(runner.params.train.Instantiate().GetDataset()))
    before = [v.numpy() for v in runner.variables]
    _, _, applied = runner.TrainStep(batch)
    self.assertFalse(bool(applied))
    self.assertLess(float(runner.optimizer.dynamic_scale), 2.0**60)
    for a, b in zip(before, runner.variables):
      self.assertAllEqual(a, b)


if __name__ == '__main__':
  tf.test.main()
