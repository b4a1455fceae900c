"""tools/benchmark_predict: the simulator's step from measured F, B and W costs (pure Python, no devices)."""

import unittest

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import ticks as ticks_lib
from tools import benchmark_predict as predict_lib

F, B, W, BW = schedule_lib.F, schedule_lib.B, schedule_lib.W, schedule_lib.BW


def _Busy(schedule, costs):
  """Each device's work from the costs, counted action by action over the
  schedule as the engine runs it (a B right before its W is one BW)."""
  per_kind = {F: costs.forward, B: costs.backward, W: costs.weight,
              BW: costs.backward_weight}
  joined = ticks_lib.JoinBackward(schedule)
  return [sum(per_kind[a.kind][a.stage] for a in acts)
          for acts in joined.actions]


def _Makespan(schedule, pieces, comm=0.0):
  """The predicted step of `schedule`, every stage's pieces `pieces`."""
  costs = predict_lib.StageCostsOf(pieces, [0.0] * len(pieces), comm)
  return predict_lib.Predict(schedule, costs).makespan


class PredictTest(unittest.TestCase):

  def testPieceWeightIsWhatTheBackwardAddsToB(self):
    piece = predict_lib.PieceCosts(forward=1.0, backward=1.2, backward_weight=2.0)
    self.assertAlmostEqual(piece.weight, 0.8)
    # A noisy measurement never makes W negative.
    self.assertEqual(predict_lib.PieceCosts(1.0, 2.1, 2.0).weight, 0.0)

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

  def testRecomputeAddsItsForwardToTheBackward(self):
    pieces = [predict_lib.PieceCosts(1.0, 1.0, 2.0),
              predict_lib.PieceCosts(2.0, 1.5, 3.5)]
    costs = predict_lib.StageCostsOf(pieces, [0.5, 0.0], comm=0.1)
    self.assertEqual(costs.forward, [1.0, 2.0])
    self.assertEqual(costs.backward, [1.5, 1.5])
    self.assertEqual(costs.backward_weight, [2.5, 3.5])
    self.assertEqual(costs.weight, [1.0, 2.0])
    self.assertEqual(costs.comm, 0.1)

  def testEveryDeviceDoesAllItsWorkWeightGradientsIncluded(self):
    pieces = [predict_lib.PieceCosts(1.0, 1.1, 1.9),
              predict_lib.PieceCosts(1.2, 1.0, 2.2),
              predict_lib.PieceCosts(0.9, 1.0, 1.8),
              predict_lib.PieceCosts(1.1, 1.2, 2.1)]
    for name, k, v in (('zb_h1', 2, 1), ('1f1b', 2, 1), ('gpipe', 2, 1),
                       ('zbv', 2, 2), ('dualpipe_v', 2, 2),
                       ('interleaved_1f1b', 2, 2)):
      schedule = schedule_lib.Make(name, k, 8, v)
      costs = predict_lib.StageCostsOf(pieces[:k * v], [0.0] * (k * v), 0.01)
      sim = predict_lib.Predict(schedule, costs)
      want = _Busy(schedule, costs)
      for got, expected in zip(sim.busy, want):
        self.assertAlmostEqual(got, expected, msg=name)
      self.assertGreaterEqual(sim.makespan, max(want), msg=name)
      self.assertLess(sim.bubble_fraction, 1.0, msg=name)

  def testDeferredWeightGradientsCostTheirOwnTime(self):
    schedule = schedule_lib.Make('zb_h1', 2, 8, 1)
    split = ticks_lib.JoinBackward(schedule)
    self.assertTrue(any(a.kind == W for acts in split.actions for a in acts))

    def _Deferred(weight_share):
      return _Makespan(schedule, [predict_lib.PieceCosts(
          1.0, 2.0 - weight_share, 2.0)] * 2)

    # The same BW, more of it deferred as W: the split backwards' B ends
    # sooner and their W fills what was a bubble.
    self.assertLess(_Deferred(1.0), _Deferred(0.0))
    # W on top of the same B makes the step longer: it is not free.
    self.assertGreater(
        _Makespan(schedule, [predict_lib.PieceCosts(1.0, 1.0, 3.0)] * 2),
        _Makespan(schedule, [predict_lib.PieceCosts(1.0, 1.0, 2.0)] * 2))

  def testAJoinedBackwardTakesTheMeasuredBackward(self):
    # 1F1B runs every backward as one BW: B alone does not matter.
    schedule = schedule_lib.Make('1f1b', 2, 4, 1)
    cheap_b = [predict_lib.PieceCosts(1.0, 0.5, 2.0)] * 2
    self.assertAlmostEqual(
        _Makespan(schedule, cheap_b),
        _Makespan(schedule, [predict_lib.PieceCosts(1.0, 1.9, 2.0)] * 2))
    # GPipe at K=2, F=1, BW=2: 3 (M + K - 1).
    self.assertAlmostEqual(
        _Makespan(schedule_lib.Make('gpipe', 2, 4, 1), cheap_b), 15.0)

  def testCommDelaysEveryCrossing(self):
    schedule = schedule_lib.Make('gpipe', 2, 4, 1)
    pieces = [predict_lib.PieceCosts(1.0, 1.0, 2.0)] * 2
    # The fill and the drain each cross once on the critical path.
    self.assertAlmostEqual(_Makespan(schedule, pieces, 0.5) -
                           _Makespan(schedule, pieces), 1.0)

  def testSummaryAndMeasuredBubble(self):
    schedule = schedule_lib.Make('1f1b', 2, 4, 1)
    pieces = [predict_lib.PieceCosts(1.0, 1.0, 2.0)] * 2
    summary = predict_lib.Summary(schedule, 'always', pieces, 0.0)
    self.assertEqual(summary['recompute_shares'],
                     predict_lib.RecomputeShares(schedule, 'always'))
    self.assertGreater(summary['predicted_seconds'],
                       predict_lib.Summary(schedule, 'never', pieces,
                                           0.0)['predicted_seconds'])
    self.assertAlmostEqual(predict_lib.MeasuredBubble([3.0, 1.0], 4.0), 0.5)


if __name__ == '__main__':
  unittest.main()
