"""schedule/controllable.py: V-Half and V-Min validate and hold about 1/2 and 1/3 of 1F1B's activations, without TensorFlow."""

import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import controllable
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import synthesize


def _StepAndPeak(sched, stage_time, activations):
  """Simulated step and fullest device's activations (unit passes of
  ``stage_time``, every stage-micro-batch holding ``activations``)."""
  s = sched.num_stages
  times = [stage_time] * s
  sim = schedule.Simulate(sched, times, times, times)
  prof = memory.Profile(sched, [memory.StageBytes(activations=activations)] * s,
                        memory.KeptForwards(sched, 'never'), sim)
  return sim.makespan, max(prof.step_peak)


def _OneFOneB(k, m):
  # 1F1B's stage is two of the V's half-stages: twice the time and bytes.
  return _StepAndPeak(schedule.Make('1f1b', k, m), 2.0, 2.0)


class ControllableTest(unittest.TestCase):

  def testEveryBlockRepeatsWithoutCollisions(self):
    for k in (1, 2, 3, 4, 8):
      for interval in (6, 7, 9):
        for w_last in (True, False):
          block = controllable.BuildingBlock(k, interval, w_last)
          devices = schedule.VStageDevices(k)
          self.assertEqual(len(block), 3 * 2 * k)
          for d in range(k):
            residues = [t % interval for (_, s), t in block.items()
                        if devices[s] == d]
            self.assertEqual(len(residues), len(set(residues)), (k, d))
          for s in range(2 * k):  # Each pass after what it reads.
            self.assertLess(block[schedule.B, s], block[schedule.W, s])
            if s:
              self.assertLess(block[schedule.F, s - 1], block[schedule.F, s])
              self.assertLess(block[schedule.B, s], block[schedule.B, s - 1])

  def testSchedulesValidateForAnyMicroBatches(self):
    for k in (1, 2, 3, 5):
      for m in (1, 2, 7, 4 * k):
        for name, sched in controllable.Families(k, m):
          sched.Validate()
          self.assertEqual(list(sched.stage_devices), schedule.VStageDevices(k))
          self.assertEqual(sched.num_micro_batches, m, name)

  def testVHalfHoldsHalfOfOneFOneBAtItsStep(self):
    for k in (2, 4, 8, 16):
      m = 4 * k
      step, peak = _StepAndPeak(controllable.VHalf(k, m), 1.0, 1.0)
      one_step, one_peak = _OneFOneB(k, m)
      self.assertLessEqual(peak, 0.5 * one_peak, k)
      self.assertLessEqual(step, one_step, k)

  def testVMinHoldsAboutAThird(self):
    for k, most in ((4, 0.38), (8, 0.32), (16, 0.29)):
      m = 4 * k
      step, peak = _StepAndPeak(controllable.VMin(k, m), 1.0, 1.0)
      one_step, one_peak = _OneFOneB(k, m)
      self.assertLessEqual(peak, most * one_peak, k)
      self.assertLess(peak, _StepAndPeak(controllable.VHalf(k, m), 1.0,
                                         1.0)[1] + (k == 4), k)
      self.assertLessEqual(step, 1.34 * one_step, k)

  def testBadInputsAreNamed(self):
    with self.assertRaisesRegex(schedule.ScheduleError, 'interval must be'):
      controllable.BuildingBlock(2, 5)
    with self.assertRaisesRegex(schedule.ScheduleError, 'num_virtual_stages'):
      controllable.VHalf(2, 4, num_virtual_stages=1)
    with self.assertRaisesRegex(schedule.ScheduleError, 'num_micro_batches'):
      controllable.VMin(2, 0)

  def testTheSynthesizerStartsFromThem(self):
    # Half of 1F1B's peak on unit sizes, V = 2: no library schedule fits,
    # and the synthesized step is no longer than V-Half's.
    k, m = 4, 16
    problem = synthesize.Problem.Make(k, m, 1.0, 1.0, 1.0,
                                      memory.StageBytes(activations=1.0),
                                      num_virtual_stages=2)
    budget = 0.5 * _OneFOneB(k, m)[1]
    found = synthesize.Synthesize(problem, budget)
    self.assertIsNone(found.best_library)
    half = synthesize.Evaluate(problem, controllable.VHalf(k, m))
    self.assertTrue(half.Fits(found.budget))
    self.assertLessEqual(found.best.makespan, half.makespan)
    self.assertTrue(found.best.Fits(found.budget))


if __name__ == '__main__':
  unittest.main()
