"""PipeliningLayer: placement of every cell's ops, what remat recomputes and the memory it saves, balance and errors."""

import collections

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from gpipe_tf.layers import core
from gpipe_tf.layers import ShapeMismatchError
from gpipe_tf.pipeline import MicroBatchError
from gpipe_tf.pipeline import PartitionError
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import cost as cost_lib
from gpipe_tf.pipeline import graph_flops
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline.roles import Role


def _Fc(i, din=16, dout=16, act='RELU'):
  return core.FCLayer.Params().Set(name=f'fc{i}', input_dim=din,
                                   output_dim=dout, activation=act)


def _Pipe(layers, **kw):
  return PipeliningLayer.Params().Set(name='net', layers=layers,
                                      **kw).Instantiate()


def _TrainStep(model, x):

  @tf.function
  def _Step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model.FProp(x, training=True)))
    return loss, tape.gradient(loss, model.trainable_variables)

  return _Step


# One activation per cell, so that an op's type says which cell it is of.
_ACTIVATION_OPS = (('TANH', 'Tanh', 'TanhGrad'),
                   ('SIGMOID', 'Sigmoid', 'SigmoidGrad'),
                   ('RELU6', 'Relu6', 'Relu6Grad'),
                   ('RELU', 'Relu', 'ReluGrad'))


def _TypedLayers(num_cells, per_cell=1):
  """per_cell FC layers of 16 for each cell, cell k's with activation k."""
  return [_Fc(i, act=_ACTIVATION_OPS[i // per_cell][0])
          for i in range(num_cells * per_cell)]


def _PartitionGraphs(step):
  """Runs the tf.function ``step`` once: the partition graphs the runtime
  executed (while-loop bodies included: the runtime lowers them into the
  graph it partitions)."""
  ctx = context.context()
  ctx.enable_graph_collection()
  try:
    step()
    metadata = ctx.export_run_metadata()
  finally:
    ctx.disable_graph_collection()
  return [graph for fn_graph in metadata.function_graphs
          for graph in fn_graph.partition_graphs]


def _OpsRun(step):
  """Runs the tf.function ``step`` once: Counter of (op type, device index)
  over the partition graphs the runtime executed, the ops of each function
  called whole (a cell's layers: layers/shared_trace.py) counted per call,
  on the call's device, where the runtime runs them."""
  ops = collections.Counter()

  def _Count(nodes, device):
    for node in nodes:
      where = (tf.DeviceSpec.from_string(node.device).device_index
               if device is None else device)
      if node.op in ('PartitionedCall', 'StatefulPartitionedCall'):
        _Count(context.context().get_function_def(
            node.attr['f'].func.name).node_def, where)
      else:
        ops[(node.op, where)] += 1

  for graph in _PartitionGraphs(step):
    _Count(graph.node, None)
  return ops


class PlacementTest(tf.test.TestCase):

  def testEveryLayerRanOnItsCellsDevice(self):
    """Reads the partition graphs the runtime executed: the forward and the
    backward ops of cell k's layers ran on device k, under the default
    execution (the loop) and 'unrolled'."""
    for execution in (None, 'unrolled'):
      with self.subTest(execution=execution):
        kw = {'execution': execution} if execution else {}
        pipe = _Pipe(_TypedLayers(4, per_cell=2), num_partitions=4,
                     num_micro_batches=4, remat='except_last', **kw)
        self.assertEqual(pipe.balance, [2, 2, 2, 2])
        self.assertEqual(pipe.devices, test_utils.devices.LogicalCpus()[:4])
        for k in range(4):
          for v in pipe.layers[2 * k].trainable_variables:
            self.assertEqual(
                tf.DeviceSpec.from_string(v.device).device_index, k)
        ops = _OpsRun(_TrainStep(pipe, tf.ones([8, 16])))
        for k, (_, forward, backward) in enumerate(_ACTIVATION_OPS):
          for op in (forward, backward):
            where = {d: n for (o, d), n in ops.items() if o == op}
            self.assertEqual(list(where), [k], f'{op} of cell {k} ran on '
                             f'devices {where} (device: op count)')
        # Every device ran matmuls (forward and backward).
        self.assertEqual({d for (o, d) in ops if o == 'MatMul'},
                         {0, 1, 2, 3})


def _LoopVariablesSentEachIteration(step):
  """Runs the tf.function ``step`` once: the NextIteration ops of the
  partition graphs the runtime executed (one per loop variable) whose input
  is received from another device: a tensor sent at every iteration."""
  crossing = []
  for graph in _PartitionGraphs(step):
    received = {n.name for n in graph.node if n.op == '_Recv'}
    crossing += [n.name for n in graph.node
                 if n.op == 'NextIteration' and
                 n.input[0].split(':')[0] in received]
  return crossing


class LoopVariablesStayOnTheirDeviceTest(tf.test.TestCase):

  def testNoLoopVariableCrossesDevicesBetweenIterations(self):
    """A loop carries each stage's tensors on the stage's device: only what
    a step reads from a neighbour crosses. A loop variable whose first value
    was a piece's output (a stage's y, its dx) had its Enter, Merge, Switch,
    NextIteration and Exit put on the first device: a stage of the second
    device sent its y there and back at every iteration (in a process per
    device: V-shaped schedules sent 1.1-1.8x the bytes of the unrolled step).
    """
    loss_fn = lambda y, _: loss_lib.LossTerms(tf.reduce_sum(tf.sin(y), -1))
    x = tf.random.stateless_normal([8, 16], [5, 5])
    # Every schedule and every loop execution, not their product: the
    # V-shaped zbv (whose bytes showed the bug most) under both executions,
    # each other schedule under one (folded: 1f1b; switch: interleaved_1f1b,
    # gpipe).
    for schedule, v, execution in (
        ('zbv', 2, 'folded'), ('zbv', 2, 'switch'),
        ('interleaved_1f1b', 2, 'switch'), ('1f1b', 1, 'folded'),
        ('gpipe', 1, 'switch')):
      with self.subTest(schedule=schedule, execution=execution):
        pipe = _Pipe(_TypedLayers(2 * v), num_partitions=2,
                     num_virtual_stages=v, num_micro_batches=8,
                     schedule=schedule, execution=execution,
                     remat='always')
        step = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
            x, tf.zeros([8]), loss_fn)[2])
        self.assertEqual(_LoopVariablesSentEachIteration(step), [])


class RematTest(tf.test.TestCase):

  def _Recomputed(self, schedule, remat, num_micro_batches=4):
    """Forwards recomputed per layer (one layer a cell), read off the ops
    the runtime ran, and the gradients.

    'unrolled' runs every step's ops once each, so cell k's activation ops
    (Tanh on cell 0, Sigmoid on cell 1) ran M times for the forwards plus
    once per backward that recomputes its forward.
    """
    pipe = _Pipe(_TypedLayers(2), num_partitions=2, balance=[1, 1],
                 num_micro_batches=num_micro_batches, remat=remat,
                 schedule=schedule, execution='unrolled')
    x = tf.random.stateless_normal([8, 16], [5, 5])
    loss_fn = lambda y, _: loss_lib.LossTerms(tf.reduce_sum(tf.sin(y), -1))

    @tf.function
    def _Step():
      return pipe.ComputeLossAndGradients(x, tf.zeros([8]), loss_fn)[2]

    ops = _OpsRun(_Step)
    counts = {f'fc{k}': ops[(forward, k)] - num_micro_batches
              for k, (_, forward, _) in enumerate(_ACTIVATION_OPS[:2])}
    return counts, _Step()

  def testAlwaysSkipsBackwardsThatFollowTheirForward(self):
    # 1F1B's last stage runs F(1, m) then BW(1, m) for every m: nothing to
    # save there, so only stage 0 recomputes, all four micro-batches.
    counts, grads = self._Recomputed('1f1b', 'always')
    self.assertEqual(counts, {'fc0': 4, 'fc1': 0})
    never, want = self._Recomputed('1f1b', 'never')
    self.assertEqual(never, {'fc0': 0, 'fc1': 0})
    for g, w in zip(grads, want):
      self.assertAllClose(g, w, rtol=1e-5, atol=1e-5)
    # GPipe: BW(0, M-1) directly follows F(0, M-1) on device 0.
    counts, _ = self._Recomputed('gpipe', 'always')
    self.assertEqual(counts['fc0'], 3)

  def testCellsWeighedByTheirRecomputes(self):
    # 16 equal FC layers: 1F1B with remat 'always' recomputes on cell 0 only
    # ((3 + 1) / 3 the work per layer), so cell 1 takes more layers; GPipe
    # and remat 'never' recompute alike everywhere and split evenly.
    layers = [test_utils.FcParams(i, 8, 8) for i in range(16)]
    balance = lambda **kw: _Pipe(layers, num_partitions=2,
                                 num_micro_batches=4, **kw).balance
    self.assertEqual(balance(schedule='1f1b', remat='always'), [7, 9])
    self.assertEqual(balance(schedule='1f1b', remat='never'), [8, 8])
    self.assertEqual(balance(schedule='gpipe', remat='always'), [8, 8])

  def testExceptLastAlsoSkipsTheLastMicroBatch(self):
    counts, _ = self._Recomputed('1f1b', 'except_last')
    self.assertEqual(counts, {'fc0': 3, 'fc1': 0})
    # With V = 2 under gpipe, F(0, M-1) is followed by stage 2's forwards:
    # 'always' recomputes it, 'except_last' does not.
    pipe = _Pipe(_TypedLayers(4), num_partitions=2, num_virtual_stages=2,
                 balance=[1, 1, 1, 1], num_micro_batches=3, remat='always')
    self.assertEqual([s for s in range(4) if pipe._Keep(s, 2)], [2, 3])
    self.assertTrue(all(not pipe._Keep(s, m) for s in range(4) for m in (0, 1)))
    pipe = _Pipe(_TypedLayers(4), num_partitions=2, num_virtual_stages=2,
                 balance=[1, 1, 1, 1], num_micro_batches=3,
                 remat='except_last')
    self.assertEqual([s for s in range(4) if pipe._Keep(s, 2)],
                     [0, 1, 2, 3])
    self.assertTrue(all(not pipe._Keep(s, m) for s in range(4) for m in (0, 1)))


class MemoryTest(tf.test.TestCase):

  def _PeakBytes(self, **kw):
    pipe = _Pipe([_Fc(i, 64, 64) for i in range(16)], num_partitions=2, **kw)
    step = _TrainStep(pipe, tf.random.stateless_normal([2048, 64], [1, 1]))
    step()  # Trace and warm up.
    tf.config.experimental.reset_memory_stats('CPU:0')
    before = tf.config.experimental.get_memory_info('CPU:0')['current']
    step()[0].numpy()
    return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before

  def testRematLowersPeakMemory(self):
    never = self._PeakBytes(num_micro_batches=1, remat='never')
    always = self._PeakBytes(num_micro_batches=8, remat='always')
    # 16 activations of 2048x64 floats (8 MiB) live without remat. With remat
    # 'always' at M=8: the boundary slots (inputs, outputs, their gradients,
    # cell 1's inputs: 0.5 MiB each), the last forward of the last cell (kept:
    # its backward follows it), and per cell the micro-batch its backward
    # recomputes, with the input gradients that backward has made but its
    # weight-gradient ops have not read yet: 0.48-0.51x `never` measured on
    # 2026-11-25 (keeping every forward instead gives more than `never`).
    self.assertGreater(never, 8 * 2**20)
    self.assertLess(always, 0.6 * never)


class BalanceAndErrorsTest(tf.test.TestCase):

  def testFlopsBalanceFollowsCost(self):
    layers = [_Fc(0, 16, 256), _Fc(1, 256, 16)] + [_Fc(i) for i in range(2, 8)]
    pipe = _Pipe(layers, num_partitions=2)
    self.assertEqual(pipe.balance, [1, 7])

  def testParamsAndProfileCosts(self):
    """The cost estimate decides the split: two wide layers (16 -> 512 ->
    512 -> 16) then six 16 x 16 ones, which equal costs would split 4 + 4."""
    layers = ([_Fc(0, 16, 512), _Fc(1, 512, 512), _Fc(2, 512, 16)] +
              [_Fc(i) for i in range(3, 8)])
    shape = (None, 16)
    flops, params = [], []
    for lp in layers:
      meta = lp.cls.FPropMeta(lp, shape)
      flops.append(float(meta.flops))
      params.append(float(meta.num_params))
      shape = meta.out_shapes[0]
    self.assertEqual(params[:3], [16 * 512 + 512, 512 * 512 + 512,
                                  512 * 16 + 16])
    even = partition.PartitionBalanced([1.0] * 8, 2)
    self.assertEqual(even, [4, 4])
    for cost, costs in (('flops', flops), ('params', params)):
      with self.subTest(cost=cost):
        want = partition.PartitionBalanced(costs, 2)
        self.assertNotEqual(want, even)
        self.assertEqual(want, [2, 6])  # The widest layer bounds the step.
        # remat='never': no recompute weights, the costs alone decide.
        self.assertEqual(_Pipe(layers, num_partitions=2, cost=cost,
                               remat='never').balance, want)
        self.assertEqual(cost_lib.LayerCosts(layers, cost, None), costs)
    # Measured time: robust inequalities only. The wide layers get the
    # smaller cell, and the 512 x 512 layer takes far longer than a 16 x 16.
    balance = _Pipe(layers, num_partitions=2, cost='profile',
                    profile_batch_size=32).balance
    self.assertLen(balance, 2)
    self.assertEqual(sum(balance), 8)
    self.assertLess(balance[0], balance[1])
    measured = cost_lib.LayerCosts(layers, 'profile', None,
                                   profile_batch_size=32)
    self.assertLen(measured, 8)
    self.assertTrue(all(c >= 0 for c in measured))
    self.assertGreater(measured[1], 4 * max(measured[3:]))

  def testExplicitBalance(self):
    pipe = _Pipe([_Fc(i) for i in range(5)], balance=[1, 4])
    self.assertEqual(pipe.balance, [1, 4])
    self.assertLen(pipe.devices, 2)

  def testFewerLayersThanCells(self):
    with self.assertRaisesRegex(PartitionError, r'num_partitions <= 3'):
      _Pipe([_Fc(i) for i in range(3)], num_partitions=4)

  def testMoreCellsThanDevices(self):
    with self.assertRaisesRegex(PartitionError, r'only 4 device'):
      _Pipe([_Fc(i) for i in range(8)], num_partitions=5)

  def testBalanceNotSummingToLayers(self):
    with self.assertRaisesRegex(PartitionError, r'sums to 4 .* 5 layers'):
      _Pipe([_Fc(i) for i in range(5)], balance=[2, 2])

  def testUnknownRemat(self):
    with self.assertRaisesRegex(ValueError, r'unknown remat'):
      _Pipe([_Fc(i) for i in range(2)], remat='sometimes')

  def testBatchSmallerThanMicroBatches(self):
    pipe = _Pipe([_Fc(i) for i in range(2)], num_micro_batches=4)
    with self.assertRaisesRegex(MicroBatchError, r'num_micro_batches <= 3'):
      pipe.FProp(tf.ones([3, 16]))

  def testShapeMismatchNamesBothLayers(self):
    with self.assertRaisesRegex(ShapeMismatchError, r"'fc0'.*'fc1'"):
      _Pipe([_Fc(0, 16, 8), _Fc(1, 16, 16)], num_partitions=2)

  def testCustomLayerNeedsInputShapes(self):
    layers = [core.ActivationLayer.Params().Set(name='act'), _Fc(1)]
    with self.assertRaisesRegex(cost_lib.CostEstimateError, 'input_shapes'):
      _Pipe(layers, num_partitions=2)
    pipe = _Pipe(layers, num_partitions=2, input_shapes=[(None, 16)])
    self.assertEqual(pipe.balance, [1, 1])


class LayerCallsTest(tf.test.TestCase):

  def testLayersAreCalledWholeWhereAsked(self):
    """With whole_layer_calls a cell calls its layers' shared traces whole:
    the step's partition graphs hold the calls, one per layer and piece
    run; by default they are inlined (none left). The same numbers."""
    got = {}
    for inline in (False, True):
      pipe = _Pipe([_Fc(i) for i in range(4)], num_partitions=2,
                   num_micro_batches=2, whole_layer_calls=not inline)
      step = _TrainStep(pipe, tf.random.stateless_normal([4, 16], [3, 3]))
      calls = sum(node.op in ('PartitionedCall', 'StatefulPartitionedCall')
                  for graph in _PartitionGraphs(step) for node in graph.node)
      got[inline] = step()
      if inline:
        self.assertEqual(calls, 0)
      else:
        # GPipe, M=2, remat 'always', 2 layers a cell, per cell: 2 forwards
        # (F of each layer), the first micro-batch's backward recomputing
        # its forward (F, B, W of each layer), the last one's right after
        # its forward, from it (B, W): 4 + 6 + 4 = 14 calls, 28 in all.
        self.assertEqual(calls, 28)
    for a, b in zip(tf.nest.flatten(got[False]), tf.nest.flatten(got[True])):
      self.assertAllEqual(a, b)


class PieceCallsTest(tf.test.TestCase):
  """whole_piece_min_flops: which pieces a step calls whole."""

  def _Pieces(self, pipe):
    """Every piece the layer's cells cut: (its reads, its FLOPs, whole)."""
    return [(piece.reads, graph_flops.Flops(piece.function.graph),
             piece.whole is not None)
            for c in pipe._cells for program in c.programs.values()  # pylint: disable=protected-access
            for piece in program._pieces.values()]  # pylint: disable=protected-access

  def _Step(self, pipe, x):
    """A tf.function: the loss inside the pipeline (any schedule)."""

    def _Square(outputs, labels):
      del labels
      return loss_lib.LossTerms(tf.reduce_sum(tf.square(outputs), 1), None,
                                {})

    @tf.function
    def _Train():
      loss, _, grads = pipe.ComputeLossAndGradients(x, tf.zeros([8]),
                                                    _Square)
      return loss, grads

    return _Train

  def _Calls(self, step):
    return sum(node.op in ('PartitionedCall', 'StatefulPartitionedCall')
               for graph in _PartitionGraphs(step) for node in graph.node)

  def testPiecesThatReadNoStashAreCalledWholeAboveTheFlops(self):
    """0 calls every piece that reads no stash whole (the step's partition
    graphs hold the calls); a piece reading saved activations or W's stash
    never is; None inlines them all; a threshold between two pieces' FLOPs
    calls only the larger whole. The numbers do not change."""
    x = tf.random.stateless_normal([8, 16], [3, 4])
    stashes = {Role.SAVED, Role.WCUT}
    got, stashed = {}, 0
    for schedule, remat in (('gpipe', 'always'), ('1f1b', 'never'),
                            ('zb_h1', 'always')):
      for min_flops in (None, 0):
        with self.subTest(schedule=schedule, remat=remat,
                          min_flops=min_flops):
          pipe = _Pipe([_Fc(i) for i in range(4)], num_partitions=2,
                       num_micro_batches=4, schedule=schedule, remat=remat,
                       whole_piece_min_flops=min_flops)
          step = self._Step(pipe, x)
          calls = self._Calls(step)
          got[min_flops] = step()
          pieces = self._Pieces(pipe)
          if schedule == 'gpipe':
            gpipe_flops = sorted({f for r, f, _ in pieces
                                  if not stashes.intersection(r)})
          stashed += sum(bool(stashes.intersection(r)) for r, _, _ in pieces)
          for reads, _, whole in pieces:
            self.assertEqual(whole, min_flops is not None and
                             not stashes.intersection(reads), reads)
          if min_flops is None:
            self.assertEqual(calls, 0)
          else:
            self.assertGreater(calls, 0)
      for a, b in zip(tf.nest.flatten(got[None]), tf.nest.flatten(got[0])):
        self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)
    self.assertGreater(stashed, 0)  # Pieces that read a stash were cut.

    # A threshold above the smallest stash-free piece (the forward): only
    # the larger ones (its recomputing backward) are whole.
    pipe = _Pipe([_Fc(i) for i in range(4)], num_partitions=2,
                 num_micro_batches=4, schedule='gpipe', remat='always',
                 whole_piece_min_flops=gpipe_flops[0] + 1)
    self._Step(pipe, x).get_concrete_function()
    for reads, f, whole in self._Pieces(pipe):
      self.assertEqual(whole, f > gpipe_flops[0] and
                       not stashes.intersection(reads), reads)
    self.assertTrue(any(w for _, _, w in self._Pieces(pipe)))

  def testEagerCallsRunThePiecesAsTheyAre(self):
    """Outside a tf.function nothing is called whole (a call runs as it
    is): the eager step works and matches the traced one."""
    x = tf.random.stateless_normal([8, 16], [5, 6])
    pipe = _Pipe([_Fc(i) for i in range(4)], num_partitions=2,
                 num_micro_batches=4, schedule='1f1b',
                 whole_piece_min_flops=0)
    step = self._Step(pipe, x)
    eager = step.python_function()
    traced = step()
    for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(traced)):
      self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)

  def testAnInvalidMinimumIsRefused(self):
    for bad in (-1, 1.5, True, '0'):
      with self.subTest(bad=bad):
        with self.assertRaisesRegex(ValueError, 'whole_piece_min_flops'):
          _Pipe([_Fc(i) for i in range(2)], num_partitions=2,
                whole_piece_min_flops=bad)


class CheckpointInterchangeTest(tf.test.TestCase):

  def testSequentialCheckpointLoadsIntoAnyPipeline(self):
    layers = [_Fc(i) for i in range(6)]
    seq = core.SequentialLayer.Params().Set(name='net',
                                            layers=layers).Instantiate()
    for v in seq.trainable_variables:
      v.assign(v + 1.0)
    path = tf.train.Checkpoint(model=seq).save(self.get_temp_dir() + '/ck')
    pipe = _Pipe(layers, num_partitions=3, num_micro_batches=2)
    tf.train.Checkpoint(model=pipe).restore(path).assert_consumed()
    x = tf.ones([4, 16])
    self.assertAllClose(seq.FProp(x), pipe.FProp(x))


if __name__ == '__main__':
  tf.test.main()
