"""Tests for layers/shared_run.py: runs of identical layers as one loop, same numbers."""

import shared_trace_test  # pylint: disable=g-bad-import-order
import tensorflow as tf

from gpipe_tf import layers
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import loss as loss_lib


_Blocks = shared_trace_test.Blocks
_StepFn = shared_trace_test.StepFn


def _Inputs():
  return (tf.random.stateless_normal([4, 5, 16], [1, 2]), tf.zeros([4, 5]))


class SharedRunTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    shared_trace.Stats.Reset()

  def _AssertSame(self, got, want):
    self.assertAllClose(got[0], want[0], rtol=1e-6)
    self.assertLen(got[1], len(want[1]))
    for a, b in zip(got[1], want[1]):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-5)

  def _AssertNoLoopCrossesDevices(self, step):
    """Runs `step` once: no list (variant) and no loop condition (bool)
    crosses devices in the partition graphs the runtime ran."""
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    context.enable_graph_collection()
    try:
      step()
      graphs = context.context().export_run_metadata().partition_graphs
    finally:
      context.disable_graph_collection()
    sent = [n.attr['T'].type for g in graphs for n in g.node
            if n.op == '_Send']
    self.assertNotIn(tf.variant.as_datatype_enum, sent)
    self.assertNotIn(tf.bool.as_datatype_enum, sent)

  def testStepGraphDoesNotGrowWithDepth(self):
    """A run is one loop: what a step's graph adds per block is a few ops
    per variable (its gradient out of the stack), not the block. Called one
    by one (NoRuns), each block adds its forward and backward."""

    def _Size(n, *contexts):
      net = layers.SequentialLayer.Params().Set(
          name='net', layers=_Blocks(n)).Instantiate()
      step = _StepFn(net, _Inputs())
      for c in contexts:
        c.__enter__()
      try:
        graph = step.get_concrete_function().graph
      finally:
        for c in contexts[::-1]:
          c.__exit__(None, None, None)
      return shared_trace.InlinedSize(graph, as_built=True)

    per_block = (_Size(12) - _Size(4)) / 8
    one_by_one = (_Size(12, shared_run.NoRuns()) -
                  _Size(4, shared_run.NoRuns())) / 8
    # A block has 16 variables; seen: 64 ops a block in a run (its handle
    # into the stack, its gradients read out of the run's list), 373 called
    # one by one.
    self.assertLessEqual(per_block, 4 * 16)
    self.assertGreater(one_by_one, 300)
    # Block 0 alone (nobody wants its input's gradient), then one run.
    stats = shared_trace.Stats.Get()
    self.assertEqual(stats.traces, 2)

  def testLoopsInCellsStayOnTheirDevice(self):
    """A cell's loops run whole on the cell's device: lowered into the
    step's graph, their Enter, Exit and LoopCond ops and the lists their
    body pops went to the default device (device 0), and a K=2 1F1B step
    sent them there and back on every iteration."""
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Blocks(4), num_partitions=2, num_micro_batches=2,
        balance=[2, 2], schedule='1f1b', layer_loops=True).Instantiate()
    x, paddings = _Inputs()

    @tf.function
    def _Step():
      with random_seeds.StepSeedScope(tf.constant([1, 2], tf.int64)):
        return pipe.ComputeLossAndGradients(
            (x, paddings), x, lambda o, l: loss_lib.LossTerms(
                tf.reduce_sum(tf.sin(o[0]) * l, [1, 2])))[0]
    _Step.get_concrete_function()
    self.assertEqual(shared_trace.Stats.Get().runs, 1)  # Cell 1's blocks.
    self._AssertNoLoopCrossesDevices(_Step)

  def testAPlacedModelsLoopsStayOnItsDevice(self):
    """A SequentialLayer built and stepped under tf.device: its runs' loops
    run on that device (as While kernels). Lowered, their ops went to the
    default device, and a model on a worker process (tools.benchmark
    --devices=processes) sent its lists to the chief and back on every
    iteration: 15x the step."""
    with tf.device('/device:CPU:1'):  # The variables too.
      net = layers.SequentialLayer.Params().Set(
          name='net', layers=_Blocks(4)).Instantiate()
    x, paddings = _Inputs()

    @tf.function
    def _Step():
      with tf.device('/device:CPU:1'), random_seeds.StepSeedScope(
          tf.constant([1, 2], tf.int64)):
        with tf.GradientTape() as tape:
          y = net.FProp(x, paddings, training=True)
          y = y[0] if isinstance(y, tuple) else y
          loss = tf.reduce_sum(tf.sin(y))
        return tape.gradient(loss, net.trainable_variables)[0]

    _Step.get_concrete_function()
    self.assertEqual(shared_trace.Stats.Get().runs, 1)
    self._AssertNoLoopCrossesDevices(_Step)
    # Whole on CPU:1; on the default device a lowered loop lands where it
    # should, so it stays lowered (faster).
    self.assertIn((True, '/device:CPU:1'), {  # (whole, device)
        key[3:] for key in shared_run._RUNS})  # pylint: disable=protected-access
    self.assertFalse(shared_run._IsDefaultDevice('/device:CPU:1'))  # pylint: disable=protected-access
    self.assertTrue(shared_run._IsDefaultDevice('/job:localhost/device:CPU:0'))  # pylint: disable=protected-access
    self.assertFalse(shared_run._IsDefaultDevice('/job:worker/task:0/device:CPU:0'))  # pylint: disable=protected-access

  def testRunEqualsEachLayerTracedAloneWithDropout(self):
    """Tape and tf.gradients, fused W and W in a loop of its own: the loss
    and every gradient equal the layers traced one by one (dropout on, so
    each layer's masks are its own)."""
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=_Blocks(5, dropout=0.3)).Instantiate()
    with shared_trace.Off():
      want = _StepFn(net, _Inputs())()
    for symbolic in (False, True):
      for separate in (False, True):
        with self.subTest(symbolic=symbolic, separate_w=separate):
          shared_trace.Stats.Reset()
          step = _StepFn(net, _Inputs(), symbolic=symbolic)
          if separate:
            with shared_run.SeparateWeights():
              got = step()
          else:
            got = step()
          self.assertEqual(shared_trace.Stats.Get().runs, 1)
          self._AssertSame(got, want)
    with shared_trace.Off():
      other = _StepFn(net, _Inputs(), seed=(7, 8))()
    self.assertNotAllClose(want[0], other[0])

  def testRunsStopAtAnotherKindAndAtSkips(self):
    """A run is consecutive layers of one kind: a layer of other Params
    ends it, and so does a layer that stashes or pops a skip."""
    fc = lambda i, **kw: layers.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=8, output_dim=8, **kw)
    net = layers.SequentialLayer.Params().Set(name='net', layers=[
        fc(0), fc(1), fc(2), fc(3, activation='TANH'), fc(4, activation='TANH'),
        layers.BranchLayer.Params().Set(name='b', stash=('s',)),
        fc(5), fc(6), fc(7),
        layers.MergeLayer.Params().Set(name='m', pop=('s',)),
        fc(8), fc(9)]).Instantiate()
    x = tf.random.stateless_normal([4, 8], [3, 4])
    got = _StepFn(net, (x,))()
    stats = shared_trace.Stats.Get()
    # Runs fc0-fc2 (the tape watches x), fc3-fc4, fc5-fc7 and fc8-fc9.
    self.assertEqual((stats.runs, stats.calls), (4, 10))
    with shared_trace.Off():
      want = _StepFn(net, (x,))()
    self._AssertSame(got, want)

  def testPipelineOfRunsEqualsEachLayerTracedAlone(self):
    """Cells whose blocks run as loops, under a schedule whose backward
    computes W with B (1F1B) and one that runs W apart (ZB-H1), train as
    the same pipeline with every layer traced on its own (dropout on); the
    memory model counts what a run's lists hold as the layers one by one
    keep."""
    def _Pipe(schedule):
      return PipeliningLayer.Params().Set(
          name='net', layers=_Blocks(8, dropout=0.2), num_partitions=2,
          num_micro_batches=2, balance=[4, 4], schedule=schedule,
          remat='never', layer_loops=True).Instantiate()

    def _Loss(outputs, labels):
      y = outputs[0] if isinstance(outputs, tuple) else outputs
      return loss_lib.LossTerms(tf.reduce_sum(tf.sin(y) * labels, [1, 2]))

    def _Train(pipe):
      x, paddings = _Inputs()
      labels = tf.random.stateless_normal([4, 5, 16], [5, 6])

      @tf.function
      def _Run():
        with random_seeds.StepSeedScope(tf.constant([5, 6], tf.int64)):
          return pipe.ComputeLossAndGradients((x, paddings), labels, _Loss)
      loss, _, grads = _Run()
      return loss, grads, introspect.TracedStageBytes(pipe.cells)

    for schedule in ('1f1b', 'zb_h1'):
      with self.subTest(schedule=schedule):
        shared_trace.Stats.Reset()
        got = _Train(_Pipe(schedule))
        self.assertEqual(shared_trace.Stats.Get().runs, 2)
        with shared_run.NoRuns():
          want = _Train(_Pipe(schedule))
        self.assertEqual(shared_trace.Stats.Get().runs, 2)
        self._AssertSame(got[:2], want[:2])
        for g, w in zip(got[2], want[2]):
          self.assertEqual(g.activations, w.activations)
          if schedule == 'zb_h1':  # W's cut (1F1B's W runs inside B).
            self.assertEqual(g.wcut, w.wcut)


if __name__ == '__main__':
  tf.test.main()
