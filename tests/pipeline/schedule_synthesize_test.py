"""schedule/synthesize.py: synthesized schedules validate, fit their budget and beat the library's, without TensorFlow."""

import random
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import simulate
from gpipe_tf.pipeline.schedule import synthesize

# Per micro-batch: a kept forward holds 1 + 4, a deferred W's stash 4.
_STAGE = memory.StageBytes(input=1, activations=4, wcut=4)


def _Times(problem, sched):
  """The simulated step and per-device peaks, straight from the simulator
  and the memory model (not through synthesize.Evaluate)."""
  kept = memory.KeptForwards(sched, problem.remat)
  m = problem.num_micro_batches
  back = [b + f * sum((s, i) not in kept for i in range(m)) / m
          for s, (b, f) in enumerate(zip(problem.backward, problem.forward))]
  sim = simulate.Simulate(sched, problem.forward, back, problem.weight,
                          problem.comm_time)
  return sim.makespan, memory.Profile(sched, problem.stage_bytes, kept,
                                      sim).peak


def _BestLibrary(problem, budget):
  """The fastest registered schedule within budget (None if none fits)."""
  best = None
  for name in schedule.Names():
    try:
      sched = schedule.Make(name, problem.num_devices,
                            problem.num_micro_batches,
                            problem.num_virtual_stages)
    except schedule.ScheduleError:
      continue
    step, peaks = _Times(problem, sched)
    if max(peaks) <= budget * (1 + 1e-9) and (best is None or step < best):
      best = step
  return best


def _RandomProblem(rng):
  k, v = rng.randint(1, 4), rng.choice((1, 2))
  s = k * v
  stages = [memory.StageBytes(input=rng.uniform(0, 1),
                              activations=rng.uniform(1, 4),
                              wcut=rng.uniform(0, 4),
                              pinned=rng.choice((0, 0.5)),
                              weights=rng.uniform(0, 3),
                              gradients=rng.uniform(0, 2))
            for _ in range(s)]
  return synthesize.Problem.Make(
      k, rng.randint(1, 8), [rng.uniform(0.5, 2) for _ in range(s)],
      [rng.uniform(0.5, 2) for _ in range(s)],
      [rng.uniform(0, 2) for _ in range(s)], stages, num_virtual_stages=v,
      comm_time=rng.choice((0, 0.1)), remat=rng.choice(memory.REMATS))


class SynthesizeTest(unittest.TestCase):

  def testRandomProblemsValidFitAndNoSlowerThanTheLibrary(self):
    rng = random.Random(42)
    fitted = refused = 0
    for case in range(20):
      problem = _RandomProblem(rng)
      one_f = schedule.Make('gpipe', problem.num_devices,
                            problem.num_micro_batches,
                            problem.num_virtual_stages)
      budget = max(_Times(problem, one_f)[1]) * rng.uniform(0.3, 1.2)
      with self.subTest(case=case):
        try:
          result = synthesize.Synthesize(problem, budget)
        except synthesize.MemoryBudgetError as e:
          refused += 1
          self.assertIsNone(_BestLibrary(problem, budget))
          self.assertGreater(e.smallest, budget)
          self.assertIn(f'{e.smallest:.6g}', str(e))
          # The budget the error names is one that fits.
          synthesize.Synthesize(problem, e.smallest)
          continue
        fitted += 1
        result.schedule.Validate()
        step, peaks = _Times(problem, result.schedule)
        self.assertAlmostEqual(step, result.best.makespan)
        self.assertLessEqual(max(peaks), budget * (1 + 1e-9))
        best_library = _BestLibrary(problem, budget)
        if best_library is not None:
          self.assertLessEqual(step, best_library * (1 + 1e-9))
          self.assertAlmostEqual(result.best_library.makespan, best_library)
    self.assertGreater(fitted, 8)  # Both branches ran.
    self.assertGreater(refused, 0)

  def testAtOneFOneBsPeakBeatsOneFOneBWithinIt(self):
    # F = B = W = 1: ZB-H1 fits 1F1B's peak and takes 3M + K - 1 ticks
    # against 1F1B's 3 (M + K - 1); the synthesized step is no longer.
    for k, m in ((2, 4), (4, 8), (4, 16)):
      problem = synthesize.Problem.Make(k, m, 1, 1, 1, _STAGE)
      _, peaks = _Times(problem, schedule.Make('1f1b', k, m))
      result = synthesize.Synthesize(problem, max(peaks))
      step, held = _Times(problem, result.schedule)
      with self.subTest(k=k, m=m):
        self.assertLessEqual(max(held), max(peaks))
        self.assertLessEqual(step, 3 * m + k - 1)
        self.assertLess(step, 3 * (m + k - 1))

  def testHalfTheBudgetHoldsHalf(self):
    # At half of 1F1B's peak no library schedule fits; the synthesized one
    # does, on every device, at V = 1 and in a V.
    for v in (1, 2):
      problem = synthesize.Problem.Make(4, 8, 1, 1, 1, _STAGE,
                                        num_virtual_stages=v)
      budget = 0.5 * 4 * 5 * (2 if v == 2 else 1) / v  # 1F1B dev 0: 4 x 5.
      result = synthesize.Synthesize(problem, budget)
      with self.subTest(v=v):
        self.assertIsNone(result.best_library)
        self.assertLessEqual(max(_Times(problem, result.schedule)[1]), budget)

  def testPerDeviceBudgets(self):
    problem = synthesize.Problem.Make(3, 6, 1, 1, 1, _STAGE)
    budget = (15, 10, 5)  # 1F1B's own peaks: K - d micro-batches of 5.
    result = synthesize.Synthesize(problem, budget)
    for peak, limit in zip(_Times(problem, result.schedule)[1], budget):
      self.assertLessEqual(peak, limit)

  def testNoBudgetIsTheFastestFound(self):
    problem = synthesize.Problem.Make(4, 8, 1, 1, 1, _STAGE)
    free = synthesize.Synthesize(problem)
    tight = synthesize.Synthesize(problem, 20)
    self.assertLessEqual(free.best.makespan, tight.best.makespan)
    self.assertEqual(free.budget, (float('inf'),) * 4)

  def testTooSmallABudgetNamesTheSmallestThatFits(self):
    problem = synthesize.Problem.Make(2, 4, 1, 1, 1, _STAGE)
    with self.assertRaisesRegex(synthesize.MemoryBudgetError,
                                'Raise the budget to at least 5') as ctx:
      synthesize.Synthesize(problem, 4)
    self.assertEqual(ctx.exception.smallest, 5)  # One micro-batch's 1 + 4.
    self.assertIsInstance(ctx.exception, schedule.ScheduleError)

  def testLibraryOnly(self):
    problem = synthesize.Problem.Make(4, 8, 1, 1, 1, _STAGE)
    result = synthesize.Synthesize(problem, search=False)
    self.assertTrue(result.best.library)
    self.assertEqual(result.best.source, 'zb_h1')

  def testBadInputs(self):
    with self.assertRaisesRegex(schedule.ScheduleError, 'one StageBytes per '
                                'stage: K x V = 4 stages, got 2'):
      synthesize.Problem.Make(2, 4, 1, 1, 1, [_STAGE] * 2,
                              num_virtual_stages=2)
    with self.assertRaisesRegex(schedule.ScheduleError, 'forward must be'):
      synthesize.Problem.Make(2, 4, [1, 2, 3], 1, 1)
    with self.assertRaisesRegex(schedule.ScheduleError, 'remat must be'):
      synthesize.Problem.Make(2, 4, 1, 1, 1, remat='sometimes')
    with self.assertRaisesRegex(schedule.ScheduleError, 'memory_budget must'):
      synthesize.Synthesize(synthesize.Problem.Make(2, 4, 1, 1, 1), [1, 2, 3])

  def testEvaluateRefusesAnotherSize(self):
    problem = synthesize.Problem.Make(2, 4, 1, 1, 1)
    with self.assertRaisesRegex(schedule.ScheduleError, 'the problem 2, 2 and 4'):
      synthesize.Evaluate(problem, schedule.Make('1f1b', 2, 8))


if __name__ == '__main__':
  unittest.main()
