"""The executor's guarantees, one test per engine defect found by trying it as a new user would."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

from unittest import mock  # pylint: disable=g-import-not-at-top

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import embedding
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import executor
from gpipe_tf.pipeline import loss as loss_lib


def _Fc(i, din=8, dout=8, act='TANH'):
  return core.FCLayer.Params().Set(name=f'fc{i}', input_dim=din,
                                   output_dim=dout, activation=act)


def _Build(layers, pipelined=True, **kw):
  if not pipelined:
    return core.SequentialLayer.Params().Set(name='net',
                                             layers=layers).Instantiate()
  return PipeliningLayer.Params().Set(name='net', layers=layers,
                                      **kw).Instantiate()


def _TapeGrads(model, x, variables=None):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.sin(model.FProp(x, training=True)))
  return tape.gradient(loss, variables or model.trainable_variables)


def _LossFn(y, labels):
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(y, labels))


# A variable no layer owns, read by layers in different cells (tied weights).
_SHARED = {}


class _SharedScale(base_layer.BaseLayer):
  """x * shared: reads a trainable variable that belongs to no layer."""

  def FProp(self, x, training=False):
    return x * _SHARED['v']

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(1, (shape,), 0)


class ExecutorTest(tf.test.TestCase):

  def testBatchNormMovingAverageUnderRemat(self):
    # Defect 1: the recompute read the moving statistics after the step's
    # deferred update, so the gradients were wrong.
    layers = [_Fc(0, 6, 8, 'NONE'),
              normalization.BatchNormLayer.Params().Set(
                  name='bn', dim=8, use_moving_avg_in_training=True,
                  decay=0.5),
              _Fc(1, 8, 8)]
    x = tf.random.stateless_normal([8, 6], [1, 1]) * 3.0 + 2.0
    want = _TapeGrads(_Build(layers, False), x)
    for schedule in ('gpipe', '1f1b'):
      with self.subTest(schedule=schedule):
        pipe = _Build(layers, num_partitions=2, num_micro_batches=4,
                      remat='always', schedule=schedule)
        if schedule == 'gpipe':
          got = tf.function(lambda p=pipe: _TapeGrads(p, x))()
        else:
          # The same loss as _TapeGrads, inside the pipeline.
          fn = lambda y, _: loss_lib.LossTerms(
              tf.reduce_sum(tf.sin(y), axis=-1))
          got = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
              x, tf.zeros([8]), fn)[2])()
          got = [g * 8.0 for g in got]  # The mean over 8 examples -> sum.
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-5)

  def testPersistentTapeAsksTwice(self):
    # Defect 2: the backward released its state, so a second gradient crashed.
    pipe = _Build([_Fc(i) for i in range(4)], num_partitions=2,
                  num_micro_batches=2, remat='never')
    x = tf.random.stateless_normal([4, 8], [2, 2])

    def _Twice():
      with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.sin(pipe.FProp(x, training=True)))
      return (tape.gradient(loss, pipe.trainable_variables),
              tape.gradient(loss, pipe.trainable_variables))

    for fn in (_Twice, tf.function(_Twice)):
      first, second = fn()
      for a, b in zip(first, second):
        self.assertAllClose(a, b)

  def testEagerRematSavesMemory(self):
    # Defect 3: eagerly, the outer tape recorded the rematerialised forward
    # and kept every activation alive; remat saved nothing.
    layers = [_Fc(i, 256, 256) for i in range(8)]
    x = tf.random.stateless_normal([512, 256], [3, 3])
    peaks = {}
    for remat in ('never', 'always'):
      pipe = _Build(layers, num_partitions=2, num_micro_batches=4,
                    remat=remat)
      _TapeGrads(pipe, x)  # Warm up the allocator.
      tf.config.experimental.reset_memory_stats('CPU:0')
      base = tf.config.experimental.get_memory_info('CPU:0')['current']
      _TapeGrads(pipe, x)
      peaks[remat] = (tf.config.experimental.get_memory_info('CPU:0')['peak']
                      - base)
    # 8 layers' activations vs one cell's at a time: clearly lower.
    self.assertLess(peaks['always'], 0.75 * peaks['never'], peaks)

  def testOneFOneBHoldsFewerMicroBatches(self):
    # 1F1B's point: without remat, cell k holds at most K-k micro-batches'
    # activations instead of GPipe's M, so the step's peak memory falls.
    layers = [_Fc(i, 256, 256) for i in range(16)]
    x = tf.random.stateless_normal([2048, 256], [8, 8])
    labels = tf.zeros([2048], tf.int32)
    peaks = {}
    for schedule in ('gpipe', '1f1b'):
      pipe = _Build(layers, num_partitions=2, num_micro_batches=8,
                    remat='never', schedule=schedule)
      step = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
          x, labels, _LossFn)[2])
      step()
      tf.config.experimental.reset_memory_stats('CPU:0')
      base = tf.config.experimental.get_memory_info('CPU:0')['current']
      step()
      peaks[schedule] = (
          tf.config.experimental.get_memory_info('CPU:0')['peak'] - base)
    # Measured 16.0 vs 37.8 MiB; the simulator says 2 vs 8 micro-batches on
    # device 0.
    self.assertLess(peaks['1f1b'], 0.6 * peaks['gpipe'], peaks)

  def testRecomputedDropoutWaitsForItsGate(self):
    # Defect 4: with static shapes the masks of rematerialised cells were drawn
    # before the recompute's gate and held all step.
    layers = []
    for i in range(4):
      layers += [_Fc(i), core.DropoutLayer.Params().Set(name=f'drop{i}',
                                                        keep_prob=0.5)]
    pipe = _Build(layers, num_partitions=2, num_micro_batches=2,
                  remat='always')
    x = tf.random.stateless_normal([4, 8], [4, 4])
    graph = tf.function(lambda: _TapeGrads(pipe, x)).get_concrete_function(
    ).graph
    random_ops = [op for op in graph.get_operations()
                  if op.type.startswith('StatelessRandom') and '_BW_' in
                  op.name]
    self.assertNotEmpty(random_ops)
    for op in random_ops:
      scope = op.name.split('/')[0]
      self.assertTrue(any(a.type == 'Identity' and a.control_inputs and
                          a.name.startswith(scope)
                          for a in _Ancestors(op)), op.name)

  def testSharedVariableAcrossCells(self):
    # Defect 5: a variable read in a cell but owned by none of its layers got
    # a silent None gradient.
    _SHARED['v'] = tf.Variable(tf.fill([8], 1.5), name='shared')
    layers = [_Fc(0), _SharedScale.Params().Set(name='s0'), _Fc(1),
              _SharedScale.Params().Set(name='s1')]
    x = tf.random.stateless_normal([6, 8], [5, 5])
    seq = _Build(layers, False)
    variables = list(seq.trainable_variables) + [_SHARED['v']]
    want = _TapeGrads(seq, x, variables)
    for remat in ('always', 'never'):
      with self.subTest(remat=remat):
        pipe = _Build(layers, num_partitions=2, num_micro_batches=3,
                      remat=remat, balance=[2, 2])
        got = tf.function(lambda p=pipe: _TapeGrads(
            p, x, list(p.trainable_variables) + [_SHARED['v']]))()
        self.assertIsNotNone(got[-1])
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testEmbeddingGradientsStaySparse(self):
    # Defect 6: IndexedSlices were made dense on every micro-batch.
    layers = [embedding.EmbeddingLayer.Params().Set(
        name='emb', vocab_size=1000, embedding_dim=8), _Fc(0), _Fc(1, 8, 5)]
    ids = tf.constant([[1], [5], [7], [5], [999], [3]])
    pipe = _Build(layers, num_partitions=2, num_micro_batches=3,
                  input_shapes=[(None, 1)])
    labels = tf.constant([0, 1, 2, 3, 4, 0])
    fn = lambda y, l: loss_lib.LossTerms(
        losses.SoftmaxCrossEntropy(y[:, 0], l))
    _, _, grads = pipe.ComputeLossAndGradients(ids, labels, fn)
    self.assertIsInstance(grads[0], tf.IndexedSlices)
    self.assertEqual(int(tf.size(grads[0].indices)), 6)
    seq = _Build(layers, False)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(losses.SoftmaxCrossEntropy(
          seq.FProp(ids, training=True)[:, 0], labels))
    want = tape.gradient(loss, seq.trainable_variables)
    self.assertAllClose(tf.convert_to_tensor(want[0]),
                        tf.convert_to_tensor(grads[0]), rtol=1e-5,
                        atol=1e-7)

  def testEngineAloneOrdersEveryDevice(self):
    # Defect 7: the trace's own dependencies hid a missing order. This test
    # reads the graph: each action's ops depend on the previous action on its
    # device. Without the engine's gates it fails (checked below).
    self.assertEmpty(_OrderViolations())
    with mock.patch.object(executor, '_Gate', lambda tensors, after: list(
        tensors)):
      violations = _OrderViolations()
    # Not only actions without ops of their own (see _OrderViolations):
    # consecutive forwards, which always have theirs, are unordered too.
    self.assertTrue(any(a.kind == b.kind == 'F' for a, b in violations),
                    violations)

  def testOutputsMergeAndLossOnTheLastDevice(self):
    # Defect 8: the merge, the loss and the split of the output gradients ran
    # on device 0, sending the last cell's outputs K-1 -> 0 and back.
    pipe = _Build([_Fc(i) for i in range(4)], num_partitions=2,
                  num_micro_batches=2)
    x = tf.random.stateless_normal([4, 8], [6, 6])
    last = pipe.devices[-1]
    graph = tf.function(lambda: _TapeGrads(pipe, x)).get_concrete_function(
    ).graph
    last_stage = f'stage{len(pipe.cells) - 1}_F_'
    concats = [op for op in graph.get_operations()
               if op.type == 'ConcatV2' and any(
                   i.op.name.startswith(last_stage) for i in op.inputs)]
    self.assertNotEmpty(concats)
    for op in concats:
      self.assertEqual(tf.DeviceSpec.from_string(op.device),
                       tf.DeviceSpec.from_string(last), op.name)
    graph = tf.function(lambda: pipe.ComputeLossAndGradients(
        x, tf.zeros([4], tf.int32), _LossFn)).get_concrete_function().graph
    loss_ops = [op for op in graph.get_operations() if '/loss/' in op.name]
    self.assertNotEmpty(loss_ops)
    for op in loss_ops:
      self.assertEqual(tf.DeviceSpec.from_string(op.device),
                       tf.DeviceSpec.from_string(last), op.name)


def _Ancestors(op):
  seen, stack = set(), [op]
  while stack:
    cur = stack.pop()
    if cur in seen:
      continue
    seen.add(cur)
    stack.extend(i.op for i in cur.inputs)
    stack.extend(cur.control_inputs)
  return seen


def _OrderViolations():
  """Consecutive actions on a device whose ops do not depend on each other."""
  pipe = _Build([_Fc(i) for i in range(6)], num_partitions=3,
                num_micro_batches=4, remat='always', schedule='1f1b')
  x = tf.random.stateless_normal([8, 8], [7, 7])
  graph = tf.function(lambda: pipe.ComputeLossAndGradients(
      x, tf.zeros([8], tf.int32), _LossFn)).get_concrete_function().graph
  by_scope = {}
  for op in graph.get_operations():
    by_scope.setdefault(op.name.split('/')[0], []).append(op)
  # An action without ops in its own scope counts as unordered: with the
  # gates patched out, a backward whose forward was kept (1F1B's last stage)
  # has none (TensorFlow names its gradient ops after the forward's).
  violations = []
  for row in pipe.schedule.actions:
    for a, b in zip(row, row[1:]):
      first = set(by_scope.get(f'stage{a.stage}_{a.kind}_mb{a.micro_batch}',
                               []))
      later = by_scope.get(f'stage{b.stage}_{b.kind}_mb{b.micro_batch}', [])
      reached = set()
      for op in later:
        reached |= _Ancestors(op)
      if not first & reached:
        violations.append((a, b))
  return violations


if __name__ == '__main__':
  tf.test.main()
