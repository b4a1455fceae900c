"""Every schedule as one loop (schedule_loop.py): the unrolled engine's results, a graph that does not grow with M."""

import collections

import numpy as np
import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loop as loop_lib
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule_loop as schedule_loop_lib

import executor_test as ex  # pylint: disable=g-import-not-at-top
import schedule_transparency_test as st  # pylint: disable=g-import-not-at-top

# (schedule, K, V): every library schedule, on 2 and 4 devices.
_LAYOUTS = [('1f1b', 2, 1), ('1f1b', 4, 1), ('interleaved_1f1b', 2, 2),
            ('zb_h1', 2, 1), ('zb_h1', 4, 1), ('gpipe', 2, 2)]


def _Pipe(layers, k, m, schedule, v=1, remat='always', loop=True):
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k * v, num_micro_batches=m,
      remat=remat, schedule=schedule, micro_batch_loop=loop,
      num_virtual_stages=v).Instantiate()


def _Looped(fn):
  """Runs fn; returns its result and how many ScheduleLoops it built."""
  built = []
  original = schedule_loop_lib.ScheduleLoop.LossAndGradients

  def _Counting(self, *args, **kwargs):
    built.append(1)
    return original(self, *args, **kwargs)

  schedule_loop_lib.ScheduleLoop.LossAndGradients = _Counting
  try:
    return fn(), len(built)
  finally:
    schedule_loop_lib.ScheduleLoop.LossAndGradients = original


def _Step(pipe, x, y):
  return tf.function(lambda: st._InsideLossAndGrads(pipe, x, y))()  # pylint: disable=protected-access


class LossAndGradientsTest(tf.test.TestCase):

  def testEqualsSequential(self):
    x, y = st._Data()  # pylint: disable=protected-access
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=st._MlpLayers()).Instantiate()  # pylint: disable=protected-access
    want = st._TapeLossAndGrads(seq, x, y)  # pylint: disable=protected-access
    for name, k, v in _LAYOUTS:
      for m, remat in [(3, 'always'), (4, 'except_last')]:
        with self.subTest(schedule=name, k=k, v=v, m=m, remat=remat):
          pipe = _Pipe(st._MlpLayers(), k, m, name, v, remat)  # pylint: disable=protected-access
          got, built = _Looped(lambda pipe=pipe: _Step(pipe, x, y))
          self.assertEqual(built, 1)
          st.AssertSameLossAndGrads(self, want, got)

  def testDropoutAndBatchNormEqualTheUnrolledEngine(self):
    # Batch statistics and dropout masks depend on the micro-batch split: the
    # reference is the unrolled engine of the same layout.
    x, y = st._Data()  # pylint: disable=protected-access
    for layers_name, layers_fn in [
        ('dropout', st._DropoutLayers),  # pylint: disable=protected-access
        ('batchnorm', lambda: st._BatchNormLayers(False))]:  # pylint: disable=protected-access
      for name, k, v in [('1f1b', 2, 1), ('interleaved_1f1b', 2, 2)]:
        with self.subTest(layers=layers_name, schedule=name):
          looped = _Pipe(layers_fn(), k, 3, name, v)
          unrolled = _Pipe(layers_fn(), k, 3, name, v, loop=False)
          for a, b in zip(unrolled.variables, looped.variables):
            a.assign(b)
          got, built = _Looped(lambda p=looped: _Step(p, x, y))
          self.assertEqual(built, 1)
          st.AssertSameLossAndGrads(self, _Step(unrolled, x, y), got)
          # BatchNorm's moving statistics moved once, as the unrolled ones.
          for a, b in zip(unrolled.variables, looped.variables):
            self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testGraphDoesNotGrowWithMicroBatches(self):
    x, y = st._Data(16)  # pylint: disable=protected-access

    def _Ops(m):
      pipe = _Pipe(st._MlpLayers(), 2, m, '1f1b')  # pylint: disable=protected-access
      fn = tf.function(lambda: st._InsideLossAndGrads(pipe, x, y))  # pylint: disable=protected-access
      graph = fn.get_concrete_function().graph.as_graph_def()
      return len(graph.node) + sum(len(f.node_def)
                                   for f in graph.library.function)

    self.assertEqual(_Ops(2), _Ops(8))


class _RecomputeCountingFc(core.FCLayer):
  """An FCLayer that counts, as the step runs, the forwards it recomputes
  (a py_function in the recompute's trace, added to the output as 0)."""

  runs = collections.Counter()

  def FProp(self, x, training=False):
    y = super().FProp(x, training=training)
    if base_layer.InRecompute():
      name = self.p.name

      def _Tick():
        _RecomputeCountingFc.runs[name] += 1
        return np.float32(0)

      y += tf.stop_gradient(tf.py_function(_Tick, [], tf.float32))
    return y


class RecomputeTest(tf.test.TestCase):

  def _Recomputed(self, schedule, k, m):
    layers = [_RecomputeCountingFc.Params().Set(
        name=f'fc{i}', input_dim=8, output_dim=8, activation='TANH')
              for i in range(k)]
    pipe = _Pipe(layers, k, m, schedule)
    x = tf.random.stateless_normal([8, 8], [3, 3])
    y = tf.zeros([8])
    _RecomputeCountingFc.runs.clear()
    loss_fn = lambda out, _: loss_lib.LossTerms(tf.reduce_sum(out, -1))
    step = tf.function(lambda: pipe.ComputeLossAndGradients(x, y, loss_fn))
    step()
    return pipe, dict(_RecomputeCountingFc.runs)

  def testLastStageRunsForwardLossAndBackwardAsOne(self):
    # 1F1B's last stage runs BW(m) right after F(m): the loop keeps those
    # activations (as remat 'always' does unrolled) and recomputes the rest.
    pipe, runs = self._Recomputed('1f1b', 2, 4)
    self.assertEqual(runs, {'fc0': 4})
    self.assertEqual([pipe._Remat(s, m) for s in range(2) for m in range(4)],  # pylint: disable=protected-access
                     [True] * 4 + [False] * 4)
    _, runs = self._Recomputed('1f1b', 4, 3)
    self.assertEqual(runs, {'fc0': 3, 'fc1': 3, 'fc2': 3})
    # GPipe's two loops recompute every forward, and the partitioner is
    # told so.
    pipe, runs = self._Recomputed('gpipe', 2, 3)
    self.assertEqual(runs, {'fc0': 3, 'fc1': 3})
    self.assertTrue(all(pipe._Remat(s, m) for s in range(2) for m in range(3)))  # pylint: disable=protected-access


class SharedVariableTest(tf.test.TestCase):

  def testVariableReadInTwoCellsGetsBothGradients(self):
    # The last stage's fused forward-and-backward must sum a variable no
    # layer owns in the same place as its rematerialising backward does.
    ex._SHARED['v'] = tf.Variable(tf.fill([8], 1.5), name='shared')  # pylint: disable=protected-access
    layers = [ex._Fc(0), ex._SharedScale.Params().Set(name='s0'), ex._Fc(1),  # pylint: disable=protected-access
              ex._SharedScale.Params().Set(name='s1')]  # pylint: disable=protected-access
    x = tf.random.stateless_normal([6, 8], [5, 5])
    loss_fn = lambda y, _: loss_lib.LossTerms(tf.reduce_sum(tf.sin(y), -1))
    seq = ex._Build(layers, False)  # pylint: disable=protected-access
    variables = list(seq.trainable_variables) + [ex._SHARED['v']]  # pylint: disable=protected-access
    want = [g / 6.0 for g in ex._TapeGrads(seq, x, variables)]  # pylint: disable=protected-access
    for name in ('1f1b', 'gpipe'):
      with self.subTest(schedule=name):
        pipe = _Pipe(layers, 2, 3, name)
        got, built = _Looped(lambda p=pipe: tf.function(
            lambda: p.ComputeLossAndGradients(
                x, tf.zeros([6]), loss_fn,
                variables=list(p.trainable_variables) + [ex._SHARED['v']])  # pylint: disable=protected-access
            )()[2])
        self.assertEqual(built, int(name == '1f1b'))
        self.assertIsNotNone(got[-1])
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


class LayoutTest(tf.test.TestCase):

  def testFPropNeedsTheLossInside(self):
    x, _ = st._Data()  # pylint: disable=protected-access
    for name, k, v, training in [('1f1b', 2, 1, True),
                                 ('interleaved_1f1b', 2, 2, False),
                                 ('gpipe', 2, 2, True)]:
      with self.subTest(schedule=name, v=v, training=training):
        pipe = _Pipe(st._MlpLayers(), k, 4, name, v)  # pylint: disable=protected-access
        error = (loop_lib.LoopNeedsLossError if v > 1 or name == 'gpipe'
                 else Exception)
        with self.assertRaisesRegex(error, 'ComputeLossAndGradients'):
          pipe.FProp(x, training=training)

  def testInferenceOfAnyScheduleWithOneCellPerDevice(self):
    x, _ = st._Data()  # pylint: disable=protected-access
    pipe = _Pipe(st._MlpLayers(), 2, 4, '1f1b')  # pylint: disable=protected-access
    ref = _Pipe(st._MlpLayers(), 2, 4, '1f1b', loop=False)  # pylint: disable=protected-access
    for a, b in zip(ref.variables, pipe.variables):
      a.assign(b)
    self.assertAllClose(ref.FProp(x), pipe.FProp(x), rtol=1e-6)


if __name__ == '__main__':
  tf.test.main()
