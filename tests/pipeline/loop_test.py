"""GPipe as two loops (loop.py): same results as SequentialLayer, a graph that does not grow with M."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loop as loop_lib
from gpipe_tf.pipeline import pipelining_layer
from gpipe_tf.pipeline import schedule as schedule_lib

import schedule_transparency_test as st  # pylint: disable=g-import-not-at-top

_SEED = st._SEED  # pylint: disable=protected-access


def _Pipe(layers, k, m, remat='always', schedule='gpipe', loop=True, v=1):
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k, num_micro_batches=m,
      remat=remat, schedule=schedule, micro_batch_loop=loop,
      num_virtual_stages=v).Instantiate()


def _Calls(fn):
  """Counts FillDrainLoop.Forward calls while fn runs (the loop was used)."""
  calls = []
  original = loop_lib.FillDrainLoop.Forward

  def _Counting(self, *args, **kwargs):
    calls.append(1)
    return original(self, *args, **kwargs)

  loop_lib.FillDrainLoop.Forward = _Counting
  try:
    return fn(), len(calls)
  finally:
    loop_lib.FillDrainLoop.Forward = original


class LayoutTest(tf.test.TestCase):

  def testProblemNamesWhatToChange(self):
    self.assertIsNone(loop_lib.Problem('always'))
    self.assertIsNone(loop_lib.Problem('except_last'))
    self.assertIn("remat 'always'", loop_lib.Problem('never'))
    # GPipe with one cell per device runs as two loops, the rest as one.
    self.assertTrue(loop_lib.RunsTwoLoops(schedule_lib.Make('gpipe', 2, 4)))
    self.assertFalse(loop_lib.RunsTwoLoops(schedule_lib.Make('1f1b', 2, 4)))
    self.assertFalse(loop_lib.RunsTwoLoops(
        schedule_lib.Make('gpipe', 2, 4, 2)))
    self.assertIsNone(loop_lib.FPropProblem(
        schedule_lib.Make('1f1b', 2, 4), training=False))
    self.assertIn("'1f1b'", loop_lib.FPropProblem(
        schedule_lib.Make('1f1b', 2, 4), training=True))
    self.assertIn('4 cells on 2 devices', loop_lib.FPropProblem(
        schedule_lib.Make('gpipe', 2, 4, 2), training=False))

  def testPipeliningLayerRaisesNamedErrors(self):
    layers = st._MlpLayers  # pylint: disable=protected-access
    with self.assertRaisesRegex(pipelining_layer.MicroBatchLoopError,
                                'micro_batch_loop=False'):
      _Pipe(layers(), 2, 4, remat='never')
    with self.assertRaisesRegex(pipelining_layer.TraceOnceError,
                                'micro_batch_loop=False'):
      _Pipe(st._BatchNormLayers(True), 2, 4)  # pylint: disable=protected-access

  def testNoPerActionTrace(self):
    from gpipe_tf.pipeline import trace as trace_lib  # pylint: disable=g-import-not-at-top
    x, _ = st._Data()  # pylint: disable=protected-access
    pipe = _Pipe(st._MlpLayers(), 2, 4)  # pylint: disable=protected-access
    with self.assertRaisesRegex(loop_lib.LoopTraceError,
                                'micro_batch_loop=False'):
      pipe.FProp(x, trace=trace_lib.ScheduleTrace())


class LossInsideTest(tf.test.TestCase):

  def _Check(self, layers_fn, k, m, remat, reference, n=11):
    x, y = st._Data(n)  # pylint: disable=protected-access
    pipe = _Pipe(layers_fn(), k, m, remat)

    @tf.function
    def _Step():
      return st._InsideLossAndGrads(pipe, x, y)  # pylint: disable=protected-access

    got, calls = _Calls(_Step)
    self.assertEqual(calls, 1)
    st.AssertSameLossAndGrads(self, reference(pipe, x, y), got)

  def testEqualsSequential(self):
    x, y = st._Data()  # pylint: disable=protected-access
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=st._MlpLayers()).Instantiate()  # pylint: disable=protected-access
    want = st._TapeLossAndGrads(seq, x, y)  # pylint: disable=protected-access
    for k, m, remat in [(2, 2, 'always'), (2, 3, 'except_last'),
                        (4, 8, 'always'), (4, 3, 'always')]:
      with self.subTest(k=k, m=m, remat=remat):
        self._Check(st._MlpLayers, k, m, remat,  # pylint: disable=protected-access
                    lambda *_: want)
    # 12 examples in 4 equal micro-batches: the loops keep static shapes.
    x, y = st._Data(12)  # pylint: disable=protected-access
    want = st._TapeLossAndGrads(seq, x, y)  # pylint: disable=protected-access
    with self.subTest(k=4, m=4, static=True):
      self._Check(st._MlpLayers, 4, 4, 'always', lambda *_: want, n=12)  # pylint: disable=protected-access

  def testDropoutAndBatchNormEqualTheUnrolledEngine(self):
    # Batch statistics and dropout masks depend on the micro-batch split: the
    # reference is the unrolled engine (trace_once=False) of the same K and M.
    for name, layers_fn in [('dropout', st._DropoutLayers),  # pylint: disable=protected-access
                            ('batchnorm', lambda: st._BatchNormLayers(False))]:  # pylint: disable=protected-access
      with self.subTest(layers=name):

        def _Unrolled(pipe, x, y, layers_fn=layers_fn):
          ref = _Pipe(layers_fn(), 2, 3, 'always', loop=False)
          for a, b in zip(ref.trainable_variables, pipe.trainable_variables):
            a.assign(b)
          return tf.function(
              lambda: st._InsideLossAndGrads(ref, x, y))()  # pylint: disable=protected-access

        self._Check(layers_fn, 2, 3, 'always', _Unrolled)

  def testBatchNormMovingStatisticsMoveOnce(self):
    x, y = st._Data()  # pylint: disable=protected-access
    looped = _Pipe(st._BatchNormLayers(False), 2, 4)  # pylint: disable=protected-access
    unrolled = _Pipe(st._BatchNormLayers(False), 2, 4, loop=False)  # pylint: disable=protected-access
    for a, b in zip(unrolled.variables, looped.variables):
      a.assign(b)
    for pipe in (looped, unrolled):
      tf.function(lambda pipe=pipe: st._InsideLossAndGrads(pipe, x, y))()  # pylint: disable=protected-access
    moving = [v for v in looped.variables if 'moving' in v.name]
    self.assertNotEmpty(moving)
    for a, b in zip(unrolled.variables, looped.variables):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


class TapePathTest(tf.test.TestCase):

  def testOutputsAndGradientsEqualSequential(self):
    x, _ = st._Data(n=10)  # pylint: disable=protected-access
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=st._MlpLayers()).Instantiate()  # pylint: disable=protected-access
    pipe = _Pipe(st._MlpLayers(), 4, 3)  # pylint: disable=protected-access
    for a, b in zip(seq.trainable_variables, pipe.trainable_variables):
      b.assign(a)

    def _Grads(model):
      with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
        with tf.GradientTape() as tape:
          tape.watch(x)
          out = model.FProp(x, training=True)
          loss = tf.reduce_sum(out * tf.range(5, dtype=tf.float32))
      return [out] + tape.gradient(loss, [x] + list(model.trainable_variables))

    want = _Grads(seq)
    got, calls = _Calls(tf.function(lambda: _Grads(pipe)))
    self.assertEqual(calls, 1)
    for a, b in zip(want, got):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
    inference, calls = _Calls(tf.function(lambda: pipe.FProp(x)))
    self.assertEqual(calls, 1)
    self.assertAllClose(seq.FProp(x), inference, rtol=1e-5, atol=1e-6)


class GraphSizeTest(tf.test.TestCase):

  def testOpsDoNotGrowWithMicroBatches(self):
    x, y = st._Data(n=16)  # pylint: disable=protected-access

    def _Ops(m, loop):
      pipe = _Pipe(st._MlpLayers(), 2, m, loop=loop)  # pylint: disable=protected-access
      fn = tf.function(lambda: st._InsideLossAndGrads(pipe, x, y))  # pylint: disable=protected-access
      return len(fn.get_concrete_function().graph.get_operations())

    self.assertEqual(_Ops(4, True), _Ops(16, True))
    # Without the loop the graph grows with M: the check above can fail.
    self.assertGreater(_Ops(16, False), _Ops(4, False) + 100)


class PlacementTest(tf.test.TestCase):

  def testLoopVariablesStayOnTheirCellsDevice(self):
    # A loop body's outputs pass through Identity ops tf.function makes
    # outside every device scope; each must sit beside its input, or every
    # loop variable of cells 1..K-1 crosses devices twice per tick.
    x, y = st._Data(n=8)  # pylint: disable=protected-access
    pipe = _Pipe(st._MlpLayers(), 2, 4)  # pylint: disable=protected-access
    fn = tf.function(lambda: st._InsideLossAndGrads(pipe, x, y))  # pylint: disable=protected-access
    graph = fn.get_concrete_function().graph.as_graph_def()
    library = {f.signature.name: f for f in graph.library.function}
    bodies = [library[n.attr['body'].func.name] for n in graph.node
              if n.op in ('While', 'StatelessWhile')]
    self.assertLen(bodies, 2)
    for body in bodies:
      device = {n.name: n.device for n in body.node_def}
      outputs = [n for n in body.node_def if n.op == 'Identity' and
                 n.input and device.get(n.input[0].split(':')[0])]
      self.assertNotEmpty(outputs)
      on_cell_1 = 0
      for n in outputs:
        source = device[n.input[0].split(':')[0]]
        self.assertEqual(n.device, source, n.name)
        on_cell_1 += source.endswith(':1')
      self.assertGreater(on_cell_1, 0)



class OverlapTest(tf.test.TestCase):
  """The loops let ticks overlap and run the cells' ops in their own
  executor (docs/scale.md): checked on the built graph, not timed."""

  def _Graph(self):
    x, y = st._Data(n=8)  # pylint: disable=protected-access
    pipe = _Pipe(st._MlpLayers(), 2, 4)  # pylint: disable=protected-access
    fn = tf.function(lambda: st._InsideLossAndGrads(pipe, x, y))  # pylint: disable=protected-access
    graph = fn.get_concrete_function().graph.as_graph_def()
    library = {f.signature.name: f for f in graph.library.function}
    loops = [n for n in graph.node if n.op in ('While', 'StatelessWhile')]
    self.assertLen(loops, 2)
    return library, loops

  def testNoTickWaitsForEveryCell(self):
    library, loops = self._Graph()
    for loop in loops:
      self.assertEqual(loop.attr['parallel_iterations'].i, 2)
      body = library[loop.attr['body'].func.name]
      conds = {n.name for n in body.node_def if n.op in ('If', 'StatelessIf')}
      self.assertLen(conds, 2)   # one per cell
      for n in body.node_def:
        waits_for = {i[1:] for i in n.input if i.startswith('^')}
        self.assertLess(len(waits_for & conds), 2, n.name)

  def testCellFunctionsAreInlined(self):
    library, loops = self._Graph()
    called = set()
    for loop in loops:
      body = library[loop.attr['body'].func.name]
      for n in body.node_def:
        if n.op in ('If', 'StatelessIf'):
          branch = library[n.attr['then_branch'].func.name]
          called |= {c.attr['f'].func.name for c in branch.node_def
                     if c.op in ('StatefulPartitionedCall', 'PartitionedCall')}
    # F and BW of each of the 2 cells, and the last cell's loss.
    self.assertLen(called, 5)
    for name in called:
      self.assertFalse(library[name].attr['_noinline'].b, name)


if __name__ == '__main__':
  tf.test.main()
