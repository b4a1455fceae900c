"""Tests for gpipe_tf.pipeline.schedule.Simulate: timings, bubbles, in-flight counts, errors."""

import random
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import Action
from gpipe_tf.pipeline.schedule import Schedule
from gpipe_tf.pipeline.schedule import ScheduleError


def _Acts(text):
  """'F0.0 B0.0' -> [Action('F', 0, 0), Action('B', 0, 0)] (kind, stage.micro_batch)."""
  acts = []
  for token in text.split():
    kind = token.rstrip('0123456789.')
    stage, micro_batch = token[len(kind):].split('.')
    acts.append(Action(kind, int(stage), int(micro_batch)))
  return acts


class SimulateTest(unittest.TestCase):

  def testGPipeBubbleFormulaAlsoHoldsFor1F1B(self):
    for name in ('gpipe', '1f1b'):
      for k in range(1, 7):
        for m in range(1, 10):
          result = schedule.Simulate(schedule.Make(name, k, m))
          self.assertAlmostEqual(result.bubble_fraction, (k - 1) / (m + k - 1),
                                 msg=f'{name} K={k} M={m}')
          self.assertEqual(result.makespan, 3 * (m + k - 1))
          self.assertEqual(result.busy, [3.0 * m] * k)

  def testActionsStartAsSoonAsDeviceAndInputsAllow(self):
    rng = random.Random(0)
    for name, k, m, v in (('gpipe', 3, 4, 2), ('1f1b', 4, 5, 1),
                          ('interleaved_1f1b', 3, 5, 2), ('zb_h1', 4, 6, 1)):
      sched = schedule.Make(name, k, m, v)
      times = [[rng.uniform(0.5, 2.0) for _ in range(sched.num_stages)]
               for _ in range(3)]
      result = schedule.Simulate(sched, *times, comm_time=0.25)
      duration = {'F': times[0], 'B': times[1], 'W': times[2],
                  'BW': [b + w for b, w in zip(times[1], times[2])]}
      for d, acts in enumerate(sched.actions):
        previous_end = 0.0
        for act in acts:
          ready = [result.end[dep] + (0.25 if sched.DeviceOf(dep.stage) != d else 0)
                   for dep in sched.Dependencies(act)]
          self.assertAlmostEqual(result.start[act], max([previous_end] + ready),
                                 msg=f'{name} {act}')
          self.assertAlmostEqual(result.end[act] - result.start[act],
                                 duration[act.kind][act.stage])
          previous_end = result.end[act]
        self.assertAlmostEqual(result.busy[d],
                               sum(duration[a.kind][a.stage] for a in acts))
      self.assertEqual(result.makespan, max(result.end.values()))

  def testPerStageDurations(self):
    # The slow middle stage sets the pace: stage 2 waits for it each micro-batch.
    result = schedule.Simulate(schedule.Make('gpipe', 3, 2), [1, 3, 1], 1, 1)
    self.assertEqual(result.start[Action('F', 2, 0)], 4.0)
    self.assertEqual(result.start[Action('F', 2, 1)], 7.0)

  def testCommTimeOnlyBetweenDevices(self):
    result = schedule.Simulate(schedule.Make('gpipe', 2, 1), comm_time=0.5)
    self.assertEqual(result.start[Action('F', 1, 0)], 1.5)
    self.assertEqual(result.start[Action('BW', 1, 0)], 2.5)  # Same device.
    self.assertEqual(result.start[Action('BW', 0, 0)], 5.0)
    self.assertEqual(result.makespan, 7.0)
    self.assertAlmostEqual(result.bubble_fraction, 1 - 6 / 14)

  def testBackwardCosts(self):
    split = schedule.Simulate(schedule.Make('zb_h1', 1, 1), 1, 2, 3)
    self.assertEqual(split.end[Action('B', 0, 0)], 3.0)
    self.assertEqual(split.makespan, 6.0)
    combined = schedule.Simulate(schedule.Make('1f1b', 1, 1), 1, 2, 3)
    self.assertEqual(combined.end[Action('BW', 0, 0)], 6.0)
    free_weights = schedule.Simulate(schedule.Make('zb_h1', 2, 2), 1, 1, 0)
    self.assertEqual(free_weights.busy, [4.0, 4.0])

  def testInFlightLastsUntilWeightGradient(self):
    for text, peak in (('F0.0 F0.1 B0.0 B0.1 W0.0 W0.1', 2),
                       ('F0.0 B0.0 W0.0 F0.1 B0.1 W0.1', 1),
                       ('F0.0 B0.0 F0.1 W0.0 B0.1 W0.1', 2),
                       ('F0.0 BW0.0 F0.1 BW0.1', 1)):
      result = schedule.Simulate(Schedule([_Acts(text)], 2))
      self.assertEqual(result.peak_in_flight, [peak], msg=text)

  def testBadDurations(self):
    sched = schedule.Make('gpipe', 3, 2)
    for kwargs, name in (({'forward_time': 0}, 'forward_time'),
                         ({'forward_time': float('nan')}, 'forward_time'),
                         ({'forward_time': True}, 'forward_time'),
                         ({'backward_time': [1, 2]}, 'backward_time'),
                         ({'backward_time': 'fast'}, 'backward_time'),
                         ({'weight_time': -1}, 'weight_time'),
                         ({'comm_time': -0.5}, 'comm_time')):
      with self.assertRaisesRegex(ScheduleError, f'^{name} must be a number',
                                  msg=str(kwargs)):
        schedule.Simulate(sched, **kwargs)

  def testInvalidScheduleIsRejected(self):
    with self.assertRaisesRegex(ScheduleError, 'deadlocks'):
      schedule.Simulate(Schedule([_Acts('BW0.0 F0.0')], 1))


if __name__ == '__main__':
  unittest.main()
