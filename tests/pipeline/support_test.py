"""Every cell of the support matrix (support.py) against SequentialLayer, with every feature at once; docs/support.md shows the matrix."""

from unittest import mock

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import embedding
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import engine
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import support
from gpipe_tf.pipeline import trace as trace_lib
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import ticks
from tools import support_doc

SCHEDULES = (('gpipe', 1), ('gpipe', 2), ('1f1b', 1),
             ('interleaved_1f1b', 2), ('zb_h1', 1), ('zbv', 2),
             ('dualpipe_v', 2))
K, M, N = 2, 4, 10  # Uneven: micro-batches of 3, 3, 2, 2.
_SEED = tf.constant([7, 8], tf.int64)


class _Fork(base_layer.BaseLayer):
  """x -> (x, 0.5 x): passes a tuple to the next layer."""

  def FProp(self, x, training=False):
    return x, 0.5 * x

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(1, (shape, shape), 0)


class _Join(base_layer.BaseLayer):
  def FProp(self, x, y, training=False):
    return x + y

  @classmethod
  def FPropMeta(cls, p, shape, _):
    return base_layer.LayerMeta(1, (shape,), 0)


def _Layers():
  fc = lambda i, din=8, dout=8: core.FCLayer.Params().Set(
      name=f'fc{i}', input_dim=din, output_dim=dout, activation='TANH')
  bn = lambda i, avg: normalization.BatchNormLayer.Params().Set(
      name=f'bn{i}', dim=8, decay=0.5, use_moving_avg_in_training=avg)
  # Every layer but fc0 and fc1 (the logits) carries a feature of
  # support.FEATURES; two plain FC layers (after t1, after bn1) carried none
  # and cost tracing time.
  return [
      embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=20,
                                            embedding_dim=8),
      fc(0),
      # A skip: stashed here, popped before fc(1) (the next cell at V=1,
      # three cells on at V=2).
      core.BranchLayer.Params().Set(name='branch', stash=('skip',)),
      bn(0, False), test_utils.TiedScale.Params().Set(name='t0'),
      core.DropoutLayer.Params().Set(name='drop0', keep_prob=0.7),
      test_utils.TiedScale.Params().Set(name='t1'),
      _Fork.Params().Set(name='fork'),
      _Join.Params().Set(name='join'), bn(1, True),
      test_utils.TiedScale.Params().Set(name='t2'),
      core.DropoutLayer.Params().Set(name='drop1', keep_prob=0.8),
      core.MergeLayer.Params().Set(name='merge', pop=('skip',)),
      fc(1, dout=5)]


def _Balance(v):
  # t0 and t1 in one cell, t2 in another; the tuple inside a cell.
  return {1: [7, 7], 2: [4, 3, 4, 3]}[v]


def _LossFn(logits, labels):
  # Per example: the mean over its 3 positions; the loss reads the shared
  # variable too.
  logits = logits * tf.reduce_mean(test_utils.SHARED['v'])
  per_token = losses.SoftmaxCrossEntropy(logits, labels)
  return loss_lib.LossTerms(tf.reduce_mean(per_token, 1),
                            1.0 + tf.cast(labels[:, 0], tf.float32))


def _Data():
  ids = tf.random.stateless_uniform([N, 3], [1, 2], 0, 20, tf.int32)
  labels = tf.random.stateless_uniform([N, 3], [3, 4], 0, 5, tf.int32)
  return ids, labels


def _Reference(seq, ids, labels):
  """SequentialLayer on each micro-batch with its seed, BatchNorm moving
  statistics moved once from all of them: (loss, grads, outputs)."""
  micro = microbatch.Split([ids, labels], M)
  sums, grads, outs = [], None, []
  stats = normalization.DeferredMovingStats()
  for m, (x, y) in enumerate(micro):
    with tf.GradientTape() as tape, random_seeds.StepSeedScope(
        random_seeds.FoldIn(_SEED, m)), normalization.DeferMovingStats(
            stats):
      out = seq.FProp(x, training=True)
      s = loss_lib.WeightedSums(_LossFn(out, y))
    outs.append(out)
    g = tape.gradient(s.loss, seq.trainable_variables)
    g = [tf.convert_to_tensor(x) for x in g]
    grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    sums.append(s)
  total = loss_lib.Total(sums)
  stats.Apply()
  return (total.loss / total.weight,
          [tf.convert_to_tensor(g) / total.weight for g in grads],
          tf.concat(outs, 0))


class SupportTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    test_utils.SHARED['v'] = tf.Variable(tf.fill([8], 1.1), name='shared')

  def _Want(self, ids, labels):
    """One SequentialLayer, its reference computed once for every cell:
    (initial values, inference output, loss, grads, outputs, final values)."""
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_Layers()).Instantiate()
    initial = [v.numpy() for v in seq.variables]
    inferred = seq.FProp(ids)  # Before the step moves the statistics.
    loss, grads, out = _Reference(seq, ids, labels)
    return (initial, inferred, loss, grads, out,
            [v.numpy() for v in seq.variables])

  def _Pipe(self, name, v, remat, execution, initial):
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Layers(), num_partitions=K, num_micro_batches=M,
        num_virtual_stages=v, balance=_Balance(v), schedule=name,
        remat=remat, execution=execution).Instantiate()
    self.assertLen(pipe.variables, len(initial))
    for a, b in zip(pipe.variables, initial):
      a.assign(b)
    return pipe

  def _AssertSameState(self, want, pipe):
    for a, b in zip(want, pipe.variables):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6, msg=b.name)

  def testEveryCell(self):
    ids, labels = _Data()
    remats = ('never', 'except_last', 'always')
    # The loop as it builds these small steps (whole), and as one switch
    # loop (periods.py); testEveryScheduleFolded folds them.
    executions = ('loop', 'unrolled', 'switch')
    # One reference for every cell (each cell's pipe starts from its initial
    # values and must end at its final ones).
    initial, inferred, want_loss, want_grads, want_out, final = self._Want(
        ids, labels)
    # Inference follows the schedule's forward program alone (RunPipeline
    # lowers its 'forward' phase; the interpreter reads the schedule's M
    # besides): a cell whose forward program equals one that ran is the
    # same computation, run once (1f1b's and zb_h1's equal gpipe V=1's,
    # dualpipe_v's zbv's; inference still runs in every execution).
    inferred_forwards = []
    for i, (name, v) in enumerate(SCHEDULES):
      sched = schedule_lib.Make(name, K, M, v)
      for j, path in enumerate(support.PATHS):
        remat = remats[(i + j) % 3]
        execution = executions[(i + 2 * j) % 3]
        with self.subTest(schedule=name, v=v, path=path, remat=remat,
                          execution=execution):
          if path == 'inference':
            forward = ticks.Lower(sched, phase='forward')
            if forward in inferred_forwards:
              continue
            inferred_forwards.append(forward)
          pipe = self._Pipe(name, v, remat, execution, initial)
          reason = support.Refusal(path, sched)
          if reason is not None:
            with self.assertRaises(engine.ScheduleNeedsLossError):
              pipe.FProp(ids, training=True)
            continue
          if path == 'inference':
            got = tf.function(lambda p=pipe: p.FProp(ids))()
            self.assertAllClose(inferred, got, rtol=1e-5, atol=1e-6)
            continue
          trace = trace_lib.ScheduleTrace()
          with random_seeds.StepSeedScope(_SEED):
            if path == 'loss inside':
              loss, _, grads = tf.function(
                  lambda p=pipe, t=trace: p.ComputeLossAndGradients(
                      ids, labels, _LossFn, trace=t))()
              self.assertCountEqual(
                  trace.actions, [a for row in sched.actions for a in row])
            else:
              with tf.GradientTape() as tape:
                out = pipe.FProp(ids, training=True)
                loss, _ = loss_lib.ReduceTerms(_LossFn(out, labels))
              grads = tape.gradient(loss, pipe.trainable_variables)
              self.assertAllClose(want_out, out, rtol=1e-5, atol=1e-6)
          self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
          self.assertLen(grads, len(want_grads))
          for a, b in zip(want_grads, grads):
            self.assertAllClose(a, tf.convert_to_tensor(b), rtol=1e-4,
                                atol=1e-6)
          self._AssertSameState(final, pipe)

  def testEveryScheduleFolded(self):
    # The loss inside, every feature at once, each program's repeats folded
    # into while loops (as the loop builds steps too big to build whole):
    # M = 8 and N = 22 (micro-batches of 3 and 2) give every schedule some
    # (assertIn below checks it). Each repeat is one while loop, the rest
    # built tick by tick (no switch loop): the step graph has one While op
    # per repeat (schedule_transparency_test checked this on its MLP before;
    # this is now its only check).
    remats = ('never', 'except_last', 'always')
    with mock.patch(f'{__name__}.M', 8), mock.patch(f'{__name__}.N', 22):
      ids, labels = _Data()
      initial, _, want_loss, want_grads, _, final = self._Want(ids, labels)
      for i, (name, v) in enumerate(SCHEDULES):
        with self.subTest(schedule=name, v=v, remat=remats[i % 3]):
          pipe = self._Pipe(name, v, remats[i % 3], 'folded', initial)
          joined = ticks.JoinBackward(pipe.schedule)
          program = ticks.Lower(ticks.FuseLast(joined))
          kinds = [seg.kind for seg in
                   periods.Plan(periods.Columns(program), 'folded', 0)]
          self.assertIn(periods.REPEAT, kinds)
          self.assertNotIn(periods.SWITCH, kinds)
          step = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
              ids, labels, _LossFn))
          with random_seeds.StepSeedScope(_SEED):
            ops = [op.type for op in
                   step.get_concrete_function().graph.get_operations()]
            loss, _, grads = step()
          self.assertEqual(ops.count('While'), kinds.count(periods.REPEAT))
          self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
          for a, b in zip(want_grads, grads):
            self.assertAllClose(a, tf.convert_to_tensor(b), rtol=1e-4,
                                atol=1e-6)
          self._AssertSameState(final, pipe)

  def testDocsShowTheMatrix(self):
    # Compares, never writes: the page is generated by support_doc.COMMAND.
    self.assertEqual(support_doc.SCHEDULES, SCHEDULES)
    with open(support_doc.PATH, encoding='utf-8') as f:
      text = f.read()
    self.assertEqual(
        text, support_doc.Text(),
        f'docs/support.md is stale: run `{support_doc.COMMAND}` and commit '
        'it.')


if __name__ == '__main__':
  tf.test.main()
