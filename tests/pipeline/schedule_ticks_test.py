"""Tick tables for running a schedule as one loop (schedule/ticks.py); pure Python."""

import itertools
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import ticks


def _Layouts():
  for name, k, m in itertools.product(['gpipe', '1f1b', 'zb_h1'], [1, 2, 4],
                                      [1, 3, 8]):
    yield schedule.Make(name, k, m)
  for k, m, v in [(2, 4, 2), (2, 8, 4), (4, 8, 2)]:
    yield schedule.Make('interleaved_1f1b', k, m, v)


class TicksTest(unittest.TestCase):

  def testOrderAndDependenciesHold(self):
    for sched in _Layouts():
      with self.subTest(sched=sched):
        table = ticks.Ticks(sched)
        for d, acts in enumerate(sched.actions):
          run = [a for a in acts if a.kind != schedule.W]
          self.assertEqual(run, [a for a in table.grid[d] if a is not None])
          times = [table.tick[a] for a in run]
          self.assertEqual(times, sorted(set(times)))
          for a in run:
            earliest = max([table.tick[dep] + 1
                            for dep in sched.Dependencies(a)] +
                           [table.tick[run[run.index(a) - 1]] + 1
                            if run.index(a) else 0])
            self.assertEqual(table.tick[a], earliest, a)
        self.assertEqual(table.num_ticks, 1 + max(table.tick.values()))

  def testFillDrainTakesTwiceMPlusKMinusOneTicks(self):
    for k, m in [(1, 1), (2, 4), (4, 8)]:
      self.assertEqual(ticks.Ticks(schedule.Make('gpipe', k, m)).num_ticks,
                       2 * (m + k - 1))

  def testZeroBubbleRunsBAsTheWholeBackward(self):
    table = ticks.Ticks(schedule.Make('zb_h1', 2, 4))
    kinds = {a.kind for a in table.tick}
    self.assertEqual(kinds, {schedule.F, schedule.B})

  def testBranchesAndReceipts(self):
    sched = schedule.Make('interleaved_1f1b', 2, 4, 2)
    table = ticks.Ticks(sched)
    stages = [sched.StagesOn(d) for d in range(2)]
    branch, micro = table.Branches(stages)
    got_y, got_dx = table.Receipts(sched.num_stages)
    for act, t in table.tick.items():
      d = sched.DeviceOf(act.stage)
      j = stages[d].index(act.stage)
      self.assertEqual(branch[d][t],
                       1 + 2 * j + (act.kind != schedule.F))
      self.assertEqual(micro[d][t], act.micro_batch)
      # What an action reads from a neighbour arrived by its tick.
      if act.kind == schedule.F and act.stage > 0:
        arrived = got_y[act.stage].index(act.micro_batch)
        self.assertLessEqual(arrived, t)
      if act.kind != schedule.F and act.stage < sched.num_stages - 1:
        arrived = got_dx[act.stage].index(act.micro_batch)
        self.assertLessEqual(arrived, t)
    idle = sum(row.count(0) for row in branch)
    self.assertEqual(idle, 2 * table.num_ticks - len(table.tick))

  def testFusableIsTheLastStagesForwardsFollowedByTheirBackward(self):
    self.assertEqual(ticks.Fusable(schedule.Make('1f1b', 2, 3)),
                     {(1, 0), (1, 1), (1, 2)})
    # GPipe: only the last micro-batch's backward follows its F at once.
    self.assertEqual(ticks.Fusable(schedule.Make('gpipe', 4, 3)), {(3, 2)})
    self.assertEqual(
        ticks.Fusable(schedule.Make('interleaved_1f1b', 2, 4, 2)),
        {(3, m) for m in range(4)})
    with self.assertRaisesRegex(schedule.ScheduleError,
                                r"cannot fuse \[\(0, 0\)\].*last stage"):
      ticks.Ticks(schedule.Make('1f1b', 2, 3), {(0, 0)})

  def testFusedPairRunsInItsForwardsTick(self):
    for sched in _Layouts():
      fused = ticks.Fusable(sched)
      with self.subTest(sched=sched):
        table = ticks.Ticks(sched, fused)
        plain = ticks.Ticks(sched)
        self.assertLessEqual(table.num_ticks, plain.num_ticks)
        stages = [sched.StagesOn(d) for d in range(sched.num_devices)]
        branch, _ = table.Branches(stages)
        got_y, got_dx = table.Receipts(sched.num_stages)
        for d, acts in enumerate(sched.actions):
          run = [a for a in acts if a.kind != schedule.W and not (
              a.kind != schedule.F and (a.stage, a.micro_batch) in fused)]
          self.assertEqual(run, [a for a in table.grid[d] if a is not None])
          times = [table.tick[a] for a in run]
          self.assertEqual(times, sorted(set(times)))
        for act, t in table.tick.items():
          d = sched.DeviceOf(act.stage)
          pair = (act.stage, act.micro_batch)
          if pair in fused:
            f = schedule.Action(schedule.F, *pair)
            self.assertEqual(t, table.tick[f])
            self.assertEqual(branch[d][t], 1 + 2 * len(stages[d]))
            if act.kind != schedule.F and act.stage > 0:
              self.assertEqual(got_dx[act.stage - 1][t + 1],
                               act.micro_batch)
          for dep in sched.Dependencies(act):
            if dep.kind == schedule.W:
              continue
            same = (dep.stage, dep.micro_batch) == pair and pair in fused
            self.assertLessEqual(table.tick[dep] + (0 if same else 1), t)
    # 1F1B, K=4, M=8: the last device's 8 B ticks go; 22 -> 20 ticks.
    sched = schedule.Make('1f1b', 4, 8)
    self.assertEqual(
        [ticks.Ticks(sched).num_ticks,
         ticks.Ticks(sched, ticks.Fusable(sched)).num_ticks], [22, 20])


if __name__ == '__main__':
  unittest.main()
