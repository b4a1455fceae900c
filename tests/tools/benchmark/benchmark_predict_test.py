"""tools/benchmark/predict: the step predicted from F, B, W and BW pieces measured as the engine runs them."""

import os
import time

import tensorflow as tf

from gpipe_tf import layers
from gpipe_tf.pipeline import schedule as schedule_lib
from tools.benchmark import predict as predict_lib

F, B, W, BW, FB = (schedule_lib.F, schedule_lib.B, schedule_lib.W,
                   schedule_lib.BW, schedule_lib.FB)
Pieces = predict_lib.PieceCosts


def _Makespan(schedule, pieces, remat='never', comm=predict_lib.Comm()):
  return predict_lib.Predict(schedule, remat, pieces, comm).makespan


def _Count(schedule, device, kind):
  """How many actions of `kind` device runs as the engine runs the schedule."""
  program = predict_lib.EngineSchedule(schedule)
  return sum(a.kind == kind for a in program.actions[device])


class PredictTest(tf.test.TestCase):
  """Pure: the replay of a schedule on measured pieces (no devices)."""

  def testABackwardTakesTheKeptOrTheRecomputingPiece(self):
    p = Pieces(1.0, 1.5, 0.7, 2.0, backward_remat=2.2,
               backward_weight_remat=2.9)
    self.assertEqual(p.Backward(B, True), 1.5)
    self.assertEqual(p.Backward(BW, True), 2.0)
    self.assertEqual(p.Backward(B, False), 2.2)
    self.assertEqual(p.Backward(BW, False), 2.9)
    # Not measured: the kept piece plus a forward.
    unmeasured = Pieces(1.0, 1.5, 0.7, 2.0)
    self.assertEqual(unmeasured.Backward(B, False), 2.5)
    self.assertEqual(unmeasured.Backward(BW, False), 3.0)

  def testRecomputeSharesFollowTheKeptForwards(self):
    one = schedule_lib.Make('1f1b', 2, 4, 1)
    self.assertEqual(predict_lib.RecomputeShares(one, 'never'), [0.0, 0.0])
    always = predict_lib.RecomputeShares(one, 'always')
    # 1F1B's last stage runs every backward right after its forward.
    self.assertEqual(always[-1], 0.0)
    self.assertGreater(always[0], 0.0)
    gpipe = predict_lib.RecomputeShares(schedule_lib.Make('gpipe', 2, 4, 1),
                                        'always')
    self.assertEqual(gpipe, [0.75, 0.75])

  def testEveryDeviceDoesAllItsWorkWeightGradientsIncluded(self):
    # BW = B + W: however the engine splits or joins a backward, a device
    # works M x (F + BW) per stage it holds.
    pieces = [Pieces(1.0, 1.1, 0.8, 1.9), Pieces(1.2, 1.0, 1.2, 2.2),
              Pieces(0.9, 1.0, 0.8, 1.8), Pieces(1.1, 1.2, 0.9, 2.1)]
    for name, k, v in (('zb_h1', 2, 1), ('1f1b', 2, 1), ('gpipe', 2, 1),
                       ('zbv', 2, 2), ('dualpipe_v', 2, 2),
                       ('interleaved_1f1b', 2, 2)):
      schedule = schedule_lib.Make(name, k, 8, v)
      sim = predict_lib.Predict(schedule, 'never', pieces[:k * v])
      want = [0.0] * k
      for s in range(k * v):
        want[schedule.DeviceOf(s)] += 8 * (pieces[s].forward +
                                           pieces[s].backward_weight)
      self.assertAllClose(sim.busy, want, msg=name)
      self.assertGreaterEqual(sim.makespan, max(want), msg=name)
      self.assertBetween(sim.bubble_fraction, 0.0, 1.0, msg=name)

  def testADeferredWPaysBAndWAndAJoinedOneBW(self):
    # Split B and W cost more than the BW they replace (1.5 + 1.0 > 2.0):
    # the device that defers W pays it on every split micro-batch only.
    schedule = schedule_lib.Make('zb_h1', 2, 8, 1)
    pieces = [Pieces(1.0, 1.5, 1.0, 2.0)] * 2
    sim = predict_lib.Predict(schedule, 'never', pieces)
    for d in range(2):
      split = _Count(schedule, d, W)
      self.assertEqual(split > 0, d == 1)  # The last stage defers W.
      self.assertAlmostEqual(sim.busy[d], 8 * 3.0 + 0.5 * split)

  def testDeferredWeightGradientsFillTheBubble(self):
    schedule = schedule_lib.Make('zb_h1', 2, 8, 1)

    def _Deferred(weight_share):
      return _Makespan(schedule, [Pieces(1.0, 2.0 - weight_share,
                                         weight_share, 2.0)] * 2)

    # The same BW, more of it deferred as W: the split backwards' B end
    # sooner and their W fill what was a bubble.
    self.assertLess(_Deferred(1.0), _Deferred(0.0))
    # W on top of the same B makes the step longer: it is not free.
    self.assertGreater(_Makespan(schedule, [Pieces(1.0, 1.0, 2.0, 3.0)] * 2),
                       _Makespan(schedule, [Pieces(1.0, 1.0, 1.0, 2.0)] * 2))

  def testAJoinedBackwardTakesTheMeasuredBackward(self):
    # 1F1B runs every backward as one BW: B and W alone do not matter.
    schedule = schedule_lib.Make('1f1b', 2, 4, 1)
    self.assertAlmostEqual(
        _Makespan(schedule, [Pieces(1.0, 0.5, 0.2, 2.0)] * 2),
        _Makespan(schedule, [Pieces(1.0, 1.9, 0.9, 2.0)] * 2))
    # GPipe at K=2, F=1, BW=2: 3 (M + K - 1).
    self.assertAlmostEqual(
        _Makespan(schedule_lib.Make('gpipe', 2, 4, 1),
                  [Pieces(1.0, 0.5, 0.2, 2.0)] * 2), 15.0)

  def testARecomputingBackwardTakesItsOwnPiece(self):
    schedule = schedule_lib.Make('gpipe', 2, 4, 1)
    pieces = [Pieces(1.0, 1.0, 1.0, 2.0, backward_remat=2.5,
                     backward_weight_remat=3.5)] * 2
    never = predict_lib.Predict(schedule, 'never', pieces)
    always = predict_lib.Predict(schedule, 'always', pieces)
    # Every forward not kept costs 1.5 more in its backward (3.5 vs 2.0).
    kept = predict_lib.RecomputeShares(schedule, 'always')
    for d in range(2):
      self.assertAlmostEqual(always.busy[d] - never.busy[d],
                             4 * kept[d] * 1.5)
    self.assertGreater(always.makespan, never.makespan)

  def testCommDelaysEveryCrossingAndCostsBothSides(self):
    schedule = schedule_lib.Make('gpipe', 2, 4, 1)
    pieces = [Pieces(1.0, 1.0, 1.0, 2.0)] * 2
    # The fill and the drain each cross once on the critical path.
    self.assertAlmostEqual(
        _Makespan(schedule, pieces, comm=predict_lib.Comm(0.5)) -
        _Makespan(schedule, pieces), 1.0)
    # Each device sends 4 and receives 4 messages a step.
    busy = predict_lib.Predict(schedule, 'never', pieces,
                               predict_lib.Comm(0.0, 0.25)).busy
    self.assertAllClose(busy, [12.0 + 8 * 0.25] * 2)

  def testEngineScheduleFusesTheLastStagesForwardWithItsBackward(self):
    program = predict_lib.EngineSchedule(schedule_lib.Make('1f1b', 2, 4, 1))
    self.assertTrue(all(a.kind == FB for a in program.actions[1]))
    seconds = predict_lib.ActionSeconds(
        schedule_lib.Make('1f1b', 2, 4, 1), 'never',
        [Pieces(1.0, 1.0, 1.0, 2.0), Pieces(1.5, 1.0, 1.0, 2.5)])
    self.assertEqual(seconds(program.actions[1][0]), 4.0)

  def testSummaryAndMeasuredBubble(self):
    schedule = schedule_lib.Make('1f1b', 2, 4, 1)
    pieces = [Pieces(1.0, 1.0, 1.0, 2.0)] * 2
    summary = predict_lib.Summary(schedule, 'always', pieces,
                                  predict_lib.Comm(), pieces)
    self.assertEqual(summary['recompute_shares'],
                     predict_lib.RecomputeShares(schedule, 'always'))
    self.assertEqual(summary['backward_weight_remat_seconds'], [3.0, 3.0])
    self.assertEqual(summary['predicted_seconds_wall'],
                     summary['predicted_seconds'])
    self.assertGreater(summary['predicted_seconds'], predict_lib.Summary(
        schedule, 'never', pieces, predict_lib.Comm())['predicted_seconds'])
    self.assertAlmostEqual(predict_lib.MeasuredBubble([3.0, 1.0], 4.0), 0.5)
    # Busy CPU time over two threads can pass the wall step: no bubble.
    self.assertEqual(predict_lib.MeasuredBubble([4.5, 4.1], 4.0), 0.0)

  def testThreadCpuSecondsCountsThisProcesssWork(self):
    before = predict_lib.ThreadCpuSeconds(os.getpid())
    start = time.process_time()
    while time.process_time() - start < 0.05:
      pass
    self.assertGreater(predict_lib.ThreadCpuSeconds(os.getpid()) - before,
                       0.03)


class PieceRunsTest(tf.test.TestCase):
  """The pieces timed are the engine's, and together its whole backward."""

  def testSplitPiecesComputeWhatTheJoinedOneDoes(self):
    stage = layers.SequentialLayer.Params().Set(name='stage', layers=[
        layers.FCLayer.Params().Set(name=f'fc{i}', input_dim=8, output_dim=8,
                                    activation='RELU') for i in range(2)
    ]).Instantiate()
    x = tf.random.stateless_normal([4, 8], [1, 2])
    stage.FProp(x, training=True)
    runs = predict_lib.PieceRuns(stage.layers, (x,), '/device:CPU:0',
                                 consume=False)
    self.assertEqual(set(runs), {'empty', F, B, W, BW, 'B_remat',
                                 'BW_remat'})
    variables = stage.trainable_variables
    with tf.GradientTape() as tape:
      tape.watch(x)
      # The pieces are fed dy = 1: the gradients of sum(y).
      loss = tf.reduce_sum(stage.FProp(x, training=True))
    want = tape.gradient(loss, [x] + list(variables))
    bw = runs[BW]()  # dx, then every weight gradient.
    self.assertLen(bw, 1 + len(variables))
    self.assertAllClose(bw, want)
    # W makes every weight gradient from what B stashed, and B the rest.
    self.assertAllClose(runs[W](), want[1:])
    self.assertAllClose(runs[B]()[0], want[0])
    self.assertAllClose(runs['BW_remat'](), want)
    self.assertAllClose(runs['B_remat']()[0], want[0])


if __name__ == '__main__':
  tf.test.main()
