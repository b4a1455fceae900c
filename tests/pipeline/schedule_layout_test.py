"""schedule/layout.py: the balance, V and schedule chosen together on the simulated step, without TensorFlow."""

import unittest

from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import synthesize

_BYTES = memory.StageBytes(input=1, activations=4, wcut=4, weights=2,
                           gradients=2)
_LAYER = layout.LayerCost(1.0, 1.0, 1.0, _BYTES)


class StageBytesOfTest(unittest.TestCase):

  def testFirstInputTheRestSummed(self):
    a = memory.StageBytes(input=1, activations=2, wcut=3, pinned=4,
                          weights=5, gradients=6)
    b = memory.StageBytes(input=10, activations=20, wcut=30, pinned=40,
                          weights=50, gradients=60)
    self.assertEqual(layout.StageBytesOf([a, b]),
                     memory.StageBytes(1, 22, 33, 44, 55, 66))

  def testALaterLayerAddsWhatItKeepsJoined(self):
    # Each layer keeps 4 alone and 3 more after the one before it: a
    # stage of two keeps 4 + 4 + 3; a stage's first layer adds nothing.
    joined = layout.LayerCost(1.0, 1.0, 1.0, _BYTES,
                              memory.StageBytes(activations=3, wcut=1))
    problem = layout.StageProblem([joined] * 4, (1, 2, 1), 3, 4)
    self.assertEqual([b.activations for b in problem.stage_bytes],
                     [4, 11, 4])
    self.assertEqual([b.wcut for b in problem.stage_bytes], [4, 9, 4])


class StageProblemTest(unittest.TestCase):

  def testSumsTheStagesAndAddsTheExtras(self):
    loss = layout.LayerCost(5.0, 6.0, 0.0)
    problem = layout.StageProblem([_LAYER] * 6, (1, 2, 2, 1), 2, 4,
                                  last_extra=loss, remat='always')
    self.assertEqual(problem.num_virtual_stages, 2)
    self.assertEqual(problem.forward, (1, 2, 2, 6))
    self.assertEqual(problem.backward, (1, 2, 2, 7))
    self.assertEqual(problem.stage_bytes[1].activations, 8)
    self.assertEqual(problem.stage_bytes[1].input, 1)
    self.assertEqual(problem.remat, 'always')
    with self.assertRaisesRegex(synthesize.ScheduleError, 'not a multiple'):
      layout.StageProblem([_LAYER] * 6, (3, 2, 1), 2, 4)

  def testOneFOneBPeakIsItsFirstDevicesK(self):
    # K = 2, stages of 2 layers: device 0 holds 2 micro-batches of its
    # input 1 and 2 x 4 of activations while a BW adds its 2 x 2 gradients,
    # beside weights 2 x 2 and gradient sums 2 x 2.
    self.assertEqual(layout.OneFOneBPeak([_LAYER] * 4, 2, 4),
                     4 + 4 + 2 * (1 + 8) + 4)


class ChooseTest(unittest.TestCase):

  def testALossOnTheLastStageMovesLayersOffIt(self):
    # 8 equal layers on K = 2; the loss costs two layers' worth. The even
    # split (4, 4) leaves the last stage 1.5x the first; Choose takes
    # layers off it, and its step is shorter than the even split's.
    loss = layout.LayerCost(2.0, 2.0, 2.0)
    choice = layout.Choose([_LAYER] * 8, 2, 8, virtual_stages=(1,),
                           last_extra=loss)
    self.assertLess(choice.balance[-1], 4)
    even = synthesize.Synthesize(layout.StageProblem(
        [_LAYER] * 8, (4, 4), 2, 8, last_extra=loss))
    self.assertLess(choice.makespan, even.best.makespan)

  def testNeverSlowerThanThePlainBalance(self):
    costs = [layout.LayerCost(f, 1.2 * f, 0.8 * f, _BYTES)
             for f in (3.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 2.5)]
    embedding = layout.LayerCost(1.0, 1.0, 1.0)
    for budget in (None, 60.0):
      choice = layout.Choose(costs, 2, 6, budget, first_extra=embedding)
      plain = partition.PartitionBalanced(
          [3 * 1.0 + 3.0 * 3] + [c.forward * 3 for c in costs[1:]], 2)
      self.assertEqual(plain, [3, 5])
      alone = synthesize.Synthesize(layout.StageProblem(
          costs, plain, 2, 6, first_extra=embedding), budget)
      with self.subTest(budget=budget):
        self.assertLessEqual(choice.makespan, alone.best.makespan)
        if budget:
          self.assertLessEqual(max(choice.peaks), budget)
        self.assertEqual(sum(choice.balance), len(costs))
        self.assertEqual(len(choice.balance), 2 * choice.num_virtual_stages)

  def testTriesBothVsAndKeepsTheFaster(self):
    choice = layout.Choose([_LAYER] * 8, 2, 8)
    self.assertEqual({v for v, _, _ in choice.considered}, {1, 2})
    fastest = min(step for _, _, step in choice.considered if step)
    self.assertAlmostEqual(choice.makespan, fastest)
    self.assertIn((choice.num_virtual_stages, choice.balance, choice.makespan),
                  choice.considered)

  def testSkipsLayoutsWhoseBusiestDeviceAloneIsSlower(self):
    # 8 equal layers on K = 2: the plain balance's step (V = 1 or 2) is
    # shorter than M x the work of the (5, 3) split's first device, 8 x 15.
    choice = layout.Choose([_LAYER] * 8, 2, 8)
    skipped = [b for _, b, step in choice.considered if step is None]
    self.assertIn((5, 3), skipped)
    self.assertLess(choice.makespan, 8 * 15)

  def testTooFewLayersForTwoStagesPerDeviceTriesOne(self):
    choice = layout.Choose([_LAYER] * 3, 2, 4)
    self.assertEqual({v for v, _, _ in choice.considered}, {1})

  def testNothingFitsNamesTheLeanest(self):
    with self.assertRaisesRegex(layout.MemoryBudgetError,
                                'the leanest needs') as ctx:
      layout.Choose([_LAYER] * 4, 2, 4, memory_budget=5)
    smallest = ctx.exception.smallest
    choice = layout.Choose([_LAYER] * 4, 2, 4, memory_budget=smallest)
    self.assertLessEqual(max(choice.peaks), smallest)


if __name__ == '__main__':
  unittest.main()
