"""A cell's step traced once and pruned into pieces: each piece computes exactly its share (cell_program.py)."""

from unittest import mock

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import cell_program
from gpipe_tf.pipeline import graph_edit
from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import ticks

_NUM_LAYERS = 3


def _Cell(batch_norm=False):
  layers = []
  for i in range(_NUM_LAYERS):
    layers.append(core.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=8, output_dim=8, activation='TANH'))
    if batch_norm:
      layers.append(normalization.BatchNormLayer.Params().Set(
          name=f'bn{i}', dim=8, use_moving_avg_in_training=True))
  seq = core.SequentialLayer.Params().Set(name='net',
                                          layers=layers).Instantiate()
  return cell_lib.Cell(0, seq.layers, '/device:CPU:0')


def _Program(cell, input_grads=True, defers_w=True):
  # Each layer a call of its own: the pieces' ops are counted through
  # calls, not loops (runs of layers: tests/layers/shared_run_test.py).
  with shared_run.NoRuns():
    return cell_program.CellProgram(
        cell, (0,), [tf.TensorSpec([4, 8], tf.float32)],
        tf.TensorSpec([2], tf.int64), True, input_grads=input_grads,
        defers_w=defers_w)


def _MatMuls(piece):
  """The MatMuls the piece's outputs depend on (prune may copy dead ops in,
  which TensorFlow drops when it instantiates the function), those of the
  shared layer traces it calls included."""
  return _LiveMatMuls(piece.function.graph)


def _LiveMatMuls(graph):
  live = graph_edit.Ancestors(graph.outputs, set(graph.get_operations()))
  return sum(1 if op.type == 'MatMul' else
             _LiveMatMuls(shared_trace.CalledGraph(op))
             if shared_trace.CalledGraph(op) is not None else 0
             for op in live)


def _T(by_role):
  return roles.Tensors(by_role)


def _Step(kind, keep=False):
  return ticks.Step(kind, 0, keep)


def _Blocks(n, width=16):
  from gpipe_tf.layers import transformer  # pylint: disable=g-import-not-at-top
  blocks = [transformer.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=width, hidden_dim=4 * width, num_heads=2)
            for i in range(n)]
  seq = core.SequentialLayer.Params().Set(name='net',
                                          layers=blocks).Instantiate()
  return cell_lib.Cell(0, seq.layers, '/device:CPU:0')


def _PieceSizes(cell):
  """The op count of each piece (F, B, BW and W, nothing kept) of a cell of
  _Blocks, traced with input gradients and W apart from B."""
  specs = [tf.TensorSpec([2, 4, 16], tf.float32),
           tf.TensorSpec([2, 4], tf.float32)]
  program = cell_program.CellProgram(
      cell, (0, 0), specs, tf.TensorSpec([2], tf.int64), True,
      input_grads=True, defers_w=True)
  return {kind: program.Piece(_Step(kind)).num_ops
          for kind in (ticks.F, ticks.B, ticks.BW, ticks.W)}


class CellProgramTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.cell = _Cell()
    self.program = _Program(self.cell)
    self.seed = tf.constant([1, 2], tf.int64)
    self.x = [tf.random.stateless_normal([4, 8], [1, 1])]
    self.dy = [tf.random.stateless_normal([4, 8], [2, 2])]

  def _Reference(self):
    with tf.GradientTape() as tape:
      tape.watch(self.x)
      y = self.cell.Run((0,), self.x, True)[0]
    return tape.gradient(y, self.x + self.cell.variables,
                         output_gradients=self.dy[0])

  def testEachPieceComputesItsShareOnce(self):
    p = self.program
    n = _NUM_LAYERS
    # Forward: n matmuls. A backward from saved activations: dx (n) and dw
    # (n). A recomputing one adds the forward's n. B computes dx only, W dw
    # only: together exactly the backward's.
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.F))), n)
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.BW, True))), 2 * n)
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.BW, False))), 3 * n)
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.B, True))), n)
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.B, False))), 2 * n)
    self.assertEqual(_MatMuls(p.Piece(_Step(ticks.W))), n)
    # Without input gradients (stage 0, the loss inside) B has nothing to
    # compute: W differentiates the whole cell, the first layer's dx aside.
    first = _Program(self.cell, False)
    self.assertEqual(_MatMuls(first.Piece(_Step(ticks.B, True))), 0)
    self.assertEqual(_MatMuls(first.Piece(_Step(ticks.W))), 2 * n - 1)

  def testPieceSizesCountWhatInliningKeeps(self):
    """A piece's op count (what the step's plan weighs, periods.Plan) is
    about the same whether its blocks call a shared trace or are traced
    as written: of a shared call only the ops making the outputs the piece
    reads count. Counting whole traces (a forward's saved tensors with its
    outputs) made B pieces 2x and folded what should be built whole."""
    cell = _Blocks(2)
    shared_trace.Stats.Reset()
    with shared_run.NoRuns():  # Calls (runs: the test below).
      shared = _PieceSizes(cell)
    self.assertGreater(shared_trace.Stats.Get().calls, 0)
    with shared_trace.Off():
      alone = _PieceSizes(cell)
    for kind, size in shared.items():
      self.assertBetween(size / alone[kind], 0.25, 1.4, kind)

  def testARunWeighsTheLayersItStandsFor(self):
    """A run of blocks called as one loop (layers/shared_run.py) weighs the
    layers it stands for, as called one by one, not its one copy of the
    block (weighed so, a 16-block 1F1B step was built as whole ticks of
    loops instead of one switch loop: 2.8x the first step)."""
    cell = _Blocks(8)
    shared_trace.Stats.Reset()
    with shared_run.LoopsInCells():
      runs = _PieceSizes(cell)
    self.assertEqual(shared_trace.Stats.Get().runs, 1)
    alone = _PieceSizes(cell)  # Cells call each layer on their own.
    # Weighed as one copy of the block, a run is about 1/8 of the calls.
    # A run's W is about 1.3x the calls' W: its stacks' pops, and a W
    # piece holds no placeholder for the variables it does not read.
    for kind, size in runs.items():
      self.assertBetween(size / alone[kind], 0.9, 1.4, kind)

  def testBAndWTogetherEqualTheWholeBackward(self):
    p = self.program
    want = self._Reference()
    x = {Role.SEED: [self.seed], Role.X: self.x}
    kept = p.Piece(_Step(ticks.F, True))(_T(x))
    for keep in (True, False):
      with self.subTest(keep=keep):
        feeds = (_T({Role.SAVED: kept[Role.SAVED], Role.DY: self.dy}) if keep
                 else _T({**x, Role.DY: self.dy,
                          Role.PINNED: kept[Role.PINNED]}))
        whole = p.Piece(_Step(ticks.BW, keep))(feeds)
        b = p.Piece(_Step(ticks.B, keep))(feeds)
        w = p.Piece(_Step(ticks.W))(_T({Role.WCUT: b[Role.WCUT]}))
        for got in (
            list(whole[Role.DX]) + p.dws_flat.Unpack(whole[Role.DWS]),
            list(b[Role.DX]) + p.dws_flat.Unpack(w[Role.DWS])):
          for a, g in zip(want, got):
            self.assertAllClose(a, g, rtol=1e-5, atol=1e-6)

  def testRecomputeRereadsWhatItsForwardRead(self):
    # BatchNorm normalising with its moving statistics: the forward's reads
    # are pinned and fed to the recompute, so a move in between (the tape
    # path applies the update after the forward) changes nothing.
    cell = _Cell(batch_norm=True)
    p = _Program(cell)
    self.assertLen(p.tensors[Role.PINNED], 2 * _NUM_LAYERS)
    x = {Role.SEED: [self.seed], Role.X: self.x}
    f = p.Piece(_Step(ticks.F, False))(_T(x))
    feeds = _T({**x, Role.DY: self.dy, Role.PINNED: f[Role.PINNED]})
    before = p.Piece(_Step(ticks.BW, False))(feeds)
    for v in cell.layers[1].variables:
      if 'moving' in v.name:
        v.assign(v + 3.0)
    after = p.Piece(_Step(ticks.BW, False))(feeds)
    for a, b in zip(before[Role.DX] + before[Role.DWS],
                    after[Role.DX] + after[Role.DWS]):
      self.assertAllClose(a, b)

  def testBatchNormSumsAreOneVectorOfEveryLayersSums(self):
    # Three sums a layer, packed into one vector by the forward: one add
    # and one slot a micro-batch in the step, not three a layer.
    cell = _Cell(batch_norm=True)
    p = _Program(cell)
    self.assertLen(p.tensors[Role.BN], 1)
    f = p.Piece(_Step(ticks.F, False))(
        _T({Role.SEED: [self.seed], Role.X: self.x}))
    with normalization.DeferMovingStats() as stats:
      cell.Run((0,), self.x, True)
    layers, sums = stats.Export()
    self.assertEqual(p.bn_layers, layers)
    self.assertLen(layers, _NUM_LAYERS)
    want = [x for stat in sums for x in stat]
    got = p.bn_flat.Unpack(f[Role.BN])
    self.assertLen(got, len(want))
    for g, w in zip(got, want):
      self.assertAllClose(g, w, rtol=1e-6)

  def testSmallGradientsAreOneVectorLargeOnesApart(self):
    # The FC layers' weights (64 elements) and biases (8): every gradient
    # in one vector; with at most 10 elements packed, only the biases.
    feeds = _T({Role.SEED: [self.seed], Role.X: self.x, Role.DY: self.dy})
    want = self._Reference()[1:]
    for limit, num_tensors in ((16384, 1), (10, 1 + _NUM_LAYERS)):
      with self.subTest(limit=limit), mock.patch.object(
          cell_program, '_PACKED_GRADIENT_ELEMENTS', limit):
        p = _Program(self.cell)
        self.assertLen(p.tensors[Role.DWS], num_tensors)
        got = p.dws_flat.Unpack(p.Piece(_Step(ticks.BW))(feeds)[Role.DWS])
        self.assertLen(got, len(want))
        for g, w in zip(got, want):
          self.assertAllClose(g, w, rtol=1e-5, atol=1e-6)

  def testVariablesAreDifferentiatedOnce(self):
    cell = _Cell()
    cell.layers.append(cell.layers[0])  # The first layer again: tied.
    cell.variables = cell_lib.Unique(
        [v for l in cell.layers for v in l.trainable_variables])
    p = _Program(cell)
    self.assertLen(p.variables, 2 * _NUM_LAYERS)
    self.assertLen({v.ref() for v in p.variables}, len(p.variables))

  def testProgramThatDefersNoWRunsTheSameBackwardWithoutW(self):
    # No W of the stage runs apart from its B: no W piece is cut, and its BW
    # is the one of a program that defers W.
    whole = _Program(self.cell, defers_w=False)
    self.assertTrue(self.program.w_separable)
    self.assertFalse(whole.w_separable)
    self.assertEqual(whole.Piece(_Step(ticks.W)).makes, ())
    feeds = _T({Role.SEED: [self.seed], Role.X: self.x, Role.DY: self.dy})
    want = self.program.Piece(_Step(ticks.BW))(feeds)
    got = whole.Piece(_Step(ticks.BW))(feeds)
    for role in (Role.DX, Role.DWS):
      for g, w in zip(got[role], want[role]):
        self.assertAllClose(g, w, rtol=1e-6, atol=1e-7)

  def testBackwardCastsEachWeightWhenItsGradientArrives(self):
    # Under a 16-bit policy the backward's MatMuls read the weights' casts.
    # Each reads a cast of its own, made after the gradient it multiplies,
    # not the forward's (which a piece would make as it starts and keep
    # until the backward reaches its layer); the gradients are unchanged.
    x = [tf.cast(self.x[0], tf.bfloat16)]
    dy = [tf.cast(self.dy[0], tf.bfloat16)]

    def _Bf16Program():
      with precision.Policy('mixed_bfloat16'):
        return cell_program.CellProgram(
            self.cell, (0,), [tf.TensorSpec([4, 8], tf.bfloat16)],
            tf.TensorSpec([2], tf.int64), True, defers_w=False)

    p = _Bf16Program()
    with mock.patch.object(graph_edit, 'CastsJustInTime', lambda *args: None):
      early = _Bf16Program()
    graph = p._wrapped.graph  # pylint: disable=protected-access
    backward = set(graph.get_operations()[p._mark:])  # pylint: disable=protected-access
    reads = []
    for op in backward:
      if op.type != 'MatMul':
        continue
      for x_in in op.inputs:
        if x_in.op.type == 'Cast' and x_in.op.inputs[0].op.type == (
            'ReadVariableOp'):
          reads.append(x_in.op)
          others = [y.op for y in op.inputs if y is not x_in]
          self.assertIn(x_in.op, backward)
          self.assertEqual(x_in.op.control_inputs, others)
    self.assertLen(reads, _NUM_LAYERS)  # dx = dy @ W^T, once per layer.
    feeds = _T({Role.SEED: [self.seed], Role.X: x, Role.DY: dy})
    got = p.Piece(_Step(ticks.BW))(feeds)
    want = early.Piece(_Step(ticks.BW))(feeds)
    for role in (Role.DX, Role.DWS):
      for g, w in zip(got[role], want[role]):
        self.assertAllEqual(g, w)


class LayersCalledWholeTest(tf.test.TestCase):
  """A cell called layer by layer under WholeInCells() (PipeliningLayer
  whole_layer_calls) calls each layer's shared trace whole: a
  call TensorFlow neither inlines nor copies per call site, so the step's
  graph holds a kind's ops once, not once per layer (docs/scale.md)."""

  def _Calls(self, piece):
    graph = piece.function.graph
    calls = [op for op in graph.get_operations()
             if shared_trace.CalledGraph(op) is not None]
    return calls, {op.get_attr('f').name: context.context().get_function_def(
        op.get_attr('f').name).attr for op in calls}

  def testEveryPieceCallsEachLayerWhole(self):
    cell = _Blocks(4)
    specs = [tf.TensorSpec([2, 4, 16], tf.float32),
             tf.TensorSpec([2, 4], tf.float32)]
    with shared_run.NoRuns(), shared_trace.WholeInCells():
      program = cell_program.CellProgram(
          cell, (0, 0), specs, tf.TensorSpec([2], tf.int64), True,
          input_grads=True, defers_w=True)
    # Nothing kept: B and BW recompute the forward. Per layer, F calls its
    # forward; B the forward and B; W its W; BW all three.
    for kind, per_layer in ((ticks.F, 1), (ticks.B, 2), (ticks.W, 1),
                            (ticks.BW, 3)):
      calls, attrs = self._Calls(program.Piece(_Step(kind)))
      self.assertLen(calls, 4 * per_layer, kind)
      # Four blocks of one kind (their inputs all differentiated): each
      # function is one for the four layers, called whole.
      self.assertLen(attrs, per_layer, kind)
      for name, attr in attrs.items():
        self.assertTrue(attr['_noinline'].b, name)
        self.assertTrue(attr['_nospecialize'].b, name)


if __name__ == '__main__':
  tf.test.main()
