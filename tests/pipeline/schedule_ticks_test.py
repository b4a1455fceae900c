"""Tick programs: a schedule lowered to what each device runs at each tick (schedule/ticks.py); pure Python."""

import itertools
import unittest

from gpipe_tf import errors
from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import ticks


def _Layouts():
  for name, k, m in itertools.product(['gpipe', '1f1b', 'zb_h1'], [1, 2, 4],
                                      [1, 3, 8]):
    yield schedule.Make(name, k, m)
  for k, m, v in [(2, 4, 2), (2, 8, 4), (4, 8, 2)]:
    yield schedule.Make('interleaved_1f1b', k, m, v)
  for k, m in [(2, 4), (3, 6)]:
    yield schedule.Make('zbv', k, m, 2)
    yield schedule.Make('dualpipe_v', k, m, 2)


def _Run(table, sched, d):
  """Device d's actions of `sched` in tick order (an FB as its F and the
  backward that followed it)."""
  out = []
  for act in table.grid[d]:
    if act is None:
      continue
    if act.kind != ticks.FB:
      out.append(act)
      continue
    out += [a for a in sched.actions[d] if a.kind in (
        schedule.F, schedule.B, schedule.BW) and (
            a.stage, a.micro_batch) == (act.stage, act.micro_batch)]
  return out


class LowerTest(unittest.TestCase):

  def testEveryActionKeepsItsOrderAndRunsAtItsEarliestTick(self):
    for original in _Layouts():
      for fused, joined in ((False, False), (True, False), (True, True)):
        sched = ticks.JoinBackward(original) if joined else original
        lowered = ticks.FuseLast(sched) if fused else sched
        with self.subTest(sched=repr(sched), fused=fused, joined=joined):
          table = ticks.Lower(lowered)
          for d, acts in enumerate(sched.actions):
            # W included: zero-bubble's weight gradients run where the
            # schedule put them.
            self.assertEqual(list(acts), _Run(table, sched, d))
            run = [a for a in table.grid[d] if a is not None]
            times = [table.tick[a] for a in run]
            self.assertEqual(times, sorted(set(times)))
            for i, a in enumerate(run):
              deps = [table.tick[dep] + 1
                      for dep in lowered.Dependencies(a)]
              earliest = max(deps + [table.tick[run[i - 1]] + 1 if i else 0])
              self.assertEqual(table.tick[a], earliest, a)
          self.assertEqual(table.num_ticks, 1 + max(table.tick.values()))

  def testFillDrainTakesTwiceMPlusKMinusOneTicks(self):
    for k, m in [(1, 1), (2, 4), (4, 8)]:
      self.assertEqual(ticks.Lower(schedule.Make('gpipe', k, m)).num_ticks,
                       2 * (m + k - 1))

  def testZeroBubbleRunsWAsItsOwnStep(self):
    table = ticks.Lower(schedule.Make('zb_h1', 2, 4))
    self.assertEqual({a.kind for a in table.tick},
                     {schedule.F, schedule.B, schedule.W})
    kinds = {step.kind for row in table.steps for step in row}
    self.assertEqual(kinds, {schedule.F, schedule.B, schedule.W})

  def testStepsBranchesAndReceipts(self):
    sched = schedule.Make('interleaved_1f1b', 2, 4, 2)
    keep = lambda s, m: m == 3
    table = ticks.Lower(sched, keep=keep)
    for act, t in table.tick.items():
      d = sched.DeviceOf(act.stage)
      step = table.steps[d][table.branch[d][t] - 1]
      self.assertEqual((step.kind, step.stage), (act.kind, act.stage))
      self.assertEqual(step.keep, keep(act.stage, act.micro_batch))
      self.assertEqual(table.micro[d][t], act.micro_batch)
      # What an action reads from a neighbour arrived by its tick.
      if act.kind == schedule.F and act.stage > 0:
        self.assertLessEqual(table.got_y[act.stage].index(act.micro_batch), t)
      if act.kind != schedule.F and act.stage < sched.num_stages - 1:
        self.assertLessEqual(table.got_dx[act.stage].index(act.micro_batch),
                             t)
    idle = sum(row.count(0) for row in table.branch)
    self.assertEqual(idle, 2 * table.num_ticks - len(table.tick))
    # Kept and recomputed forwards of a stage are two steps (branches).
    self.assertEqual(len(table.steps[0]), 8)

  def testSkipArrivesAtItsReaderOnlyTheTickAfterItsStash(self):
    # Every layout, a skip from the first stage to the last (and one to the
    # next stage): it arrives at the popping stage once per micro-batch,
    # the tick after the stashing F and no later than the popping F; its
    # gradient at the stashing stage the tick after the popping backward
    # (fused or not) and no later than the stashing backward.
    for sched in _Layouts():
      last = sched.num_stages - 1
      if last < 1:
        continue
      pairs = ((0, last), (0, 1))
      joined = ticks.JoinBackward(sched)
      for table in (ticks.Lower(ticks.FuseLast(joined), skips=pairs),
                    ticks.Lower(sched, phase='backward', skips=pairs)):
        with self.subTest(schedule=sched.name, k=sched.num_devices,
                          m=sched.num_micro_batches):
          self.assertEqual(table.skips, pairs)
          for i, (a, b) in enumerate(pairs):
            for act, t in table.tick.items():
              m = act.micro_batch
              if act.kind == schedule.F and act.stage == a:
                self.assertEqual(table.got_skip[i][t + 1], m)
                f_b = table.tick.get(schedule.Action(schedule.F, b, m))
                if f_b is None:  # Fused: FuseLast made it an FB.
                  f_b = table.tick[schedule.Action(ticks.FB, b, m)]
                self.assertLessEqual(t + 1, f_b)
              if act.kind in (schedule.B, schedule.BW,
                              ticks.FB) and act.stage == b:
                self.assertEqual(table.got_dskip[i][t + 1], m)
            self.assertEqual(
                sorted(m for m in table.got_skip[i] if m >= 0),
                sorted(act.micro_batch for act in table.tick
                       if act.kind == schedule.F and act.stage == a))
            self.assertEqual(
                sorted(m for m in table.got_dskip[i] if m >= 0),
                list(range(sched.num_micro_batches)))

  def testSkipMustGoToALaterStage(self):
    sched = schedule.Make('gpipe', 2, 2)
    with self.assertRaisesRegex(schedule.ScheduleError, 'later stage'):
      ticks.Lower(sched, skips=((1, 0),))

  def testPhasesSplitAFillDrainStep(self):
    sched = schedule.Make('gpipe', 3, 4, 2)
    forward = ticks.Lower(sched, phase='forward')
    backward = ticks.Lower(sched, phase='backward')
    self.assertEqual({a.kind for a in forward.tick}, {schedule.F})
    self.assertEqual({a.kind for a in backward.tick}, {schedule.BW})
    self.assertEqual(len(forward.tick) + len(backward.tick),
                     sum(len(r) for r in sched.actions))
    # The backward's receipts start at its own tick 0: its F ran before.
    self.assertEqual(min(backward.tick.values()), 0)
    with self.assertRaisesRegex(schedule.ScheduleError, 'phase'):
      ticks.Lower(sched, phase='sideways')
    with self.assertRaisesRegex(schedule.ScheduleError,
                                r"FB\(stage=5, micro_batch=3\) needs phase "
                                "'all'.*before FuseLast"):
      ticks.Lower(ticks.FuseLast(sched), phase='forward')

  def testFusableIsTheLastStagesForwardsFollowedByTheirBackward(self):
    self.assertEqual(ticks.Fusable(schedule.Make('1f1b', 2, 3)),
                     {(1, 0), (1, 1), (1, 2)})
    # GPipe: only the last micro-batch's backward follows its F at once.
    self.assertEqual(ticks.Fusable(schedule.Make('gpipe', 4, 3)), {(3, 2)})
    self.assertEqual(
        ticks.Fusable(schedule.Make('interleaved_1f1b', 2, 4, 2)),
        {(3, m) for m in range(4)})

  def testFuseLastMakesTheFusablePairsOneFBEach(self):
    for sched in _Layouts():
      fused = ticks.FuseLast(sched)
      with self.subTest(sched=repr(sched)):
        fused.Validate()
        self.assertEqual(
            {(a.stage, a.micro_batch) for row in fused.actions for a in row
             if a.kind == ticks.FB}, ticks.Fusable(sched))
        self.assertEqual(ticks.Fusable(fused), ticks.Fusable(sched))
        self.assertEqual(ticks.FuseLast(fused), fused)
        # The same work: unit-time replays end together, and an FB's
        # backward is split exactly where the original's was.
        self.assertEqual(schedule.Simulate(fused).makespan,
                         schedule.Simulate(sched).makespan)
        for s, m in ticks.Fusable(sched):
          self.assertEqual(fused.DefersW(s, m),
                           sched.DefersW(s, m))
    self.assertEqual(
        ticks.FuseLast(schedule.Make('1f1b', 2, 3)).actions[1],
        tuple(schedule.Action(ticks.FB, 1, m) for m in range(3)))

  def testFBRunsAsOneStepAndSendsItsInputGradient(self):
    for sched in _Layouts():
      with self.subTest(sched=repr(sched)):
        table = ticks.Lower(ticks.FuseLast(sched))
        self.assertLessEqual(table.num_ticks, ticks.Lower(sched).num_ticks)
        for act, t in table.tick.items():
          if act.kind != ticks.FB:
            continue
          d = sched.DeviceOf(act.stage)
          step = table.steps[d][table.branch[d][t] - 1]
          self.assertEqual(step, ticks.Step(
              ticks.FB, act.stage, True,
              sched.DefersW(act.stage, act.micro_batch)))
          if act.stage > 0 and t + 1 < table.num_ticks:
            self.assertEqual(table.got_dx[act.stage - 1][t + 1],
                             act.micro_batch)
    # 1F1B, K=4, M=8: the last device's 8 BW ticks go; 22 -> 20 ticks.
    sched = schedule.Make('1f1b', 4, 8)
    self.assertEqual(
        [ticks.Lower(sched).num_ticks,
         ticks.Lower(ticks.FuseLast(sched)).num_ticks], [22, 20])

  def testJoinBackwardMakesEachBItsWFollowsOneBW(self):
    # ZB-H1, K=2: every W of stage 0 directly follows its B; the last
    # stage's are deferred by one micro-batch (they fill its bubble).
    sched = schedule.Make('zb_h1', 2, 8)
    joined = ticks.JoinBackward(sched)
    self.assertEqual(
        {(a.stage, a.micro_batch) for row in joined.actions for a in row
         if a.kind == schedule.BW}, {(0, m) for m in range(8)})
    for original in _Layouts():
      joined = ticks.JoinBackward(original)
      with self.subTest(sched=repr(original)):
        joined.Validate()
        for before, after in zip(original.actions, joined.actions):
          # The same work in the same order: a BW where a B and its W were.
          unjoined = []
          for a in after:
            if a.kind == schedule.BW and original.DefersW(
                a.stage, a.micro_batch):
              unjoined += [schedule.Action(k, a.stage, a.micro_batch)
                           for k in (schedule.B, schedule.W)]
            else:
              unjoined.append(a)
          self.assertEqual(list(before), unjoined)
          for b, w in zip(after, after[1:]):
            self.assertFalse(b.kind == schedule.B and w == schedule.Action(
                schedule.W, b.stage, b.micro_batch))
        table = ticks.Lower(ticks.FuseLast(joined))
        alone = ticks.Lower(ticks.FuseLast(original))
        self.assertLessEqual(table.num_ticks, alone.num_ticks)
        # A stage is split only where a W stays apart.
        self.assertEqual(ticks.StagesDeferringW(table),
                         {a.stage for row in joined.actions for a in row
                          if a.kind == schedule.W})
    sched = schedule.Make('zb_h1', 2, 8)
    joined = ticks.JoinBackward(sched)
    table = ticks.Lower(ticks.FuseLast(joined))
    self.assertEqual(
        [table.num_ticks, ticks.Lower(ticks.FuseLast(sched)).num_ticks],
        [17, 24])
    self.assertEqual(ticks.StagesDeferringW(table), {1})
    self.assertEqual(table.ToAscii().splitlines()[0].split()[:5],
                     ['dev', '0:', 'F0', 'F1', 'BW0'])

  def testUnjoinedGivesBackEveryActionOfTheScheduleOnce(self):
    # What a trace records: the fused and joined program's actions, each
    # taken back apart, are the schedule's actions, each once.
    for sched in _Layouts():
      table = ticks.Lower(ticks.FuseLast(ticks.JoinBackward(sched)))
      got = [a for row in table.grid for act in row if act is not None
             for a in ticks.Unjoined(sched, table, act)]
      want = [a for row in sched.actions for a in row]
      self.assertCountEqual(got, want, sched)

  def testToAscii(self):
    table = ticks.Lower(ticks.FuseLast(schedule.Make('1f1b', 2, 3)))
    self.assertEqual(table.ToAscii().splitlines(), [
        'dev 0: F0  F1  BW0 F2  BW1 BW2',
        'dev 1: ..  FB0 FB1 ..  FB2 ..'])



class WhereTest(unittest.TestCase):
  """Errors that say where: a step's name scope, and the action, tick,
  device and marked row of a failing step."""

  def setUp(self):
    super().setUp()
    self.program = ticks.Lower(ticks.FuseLast(ticks.JoinBackward(
        schedule.Make('1f1b', 2, 4))))
    #   dev 0: F0   F1   BW0  F2   BW1  F3   BW2  BW3
    #   dev 1: ..   FB0  FB1  ..   FB2  ..   FB3  ..

  def testScopesNameTheStepAndFindScopeReadsThem(self):
    step = ticks.Step(schedule.BW, 1, True)
    self.assertEqual(ticks.Scope(step, micro_batch=3), 'stage1_BW_mb3')
    self.assertEqual(ticks.Scope(step, column=7), 'stage1_BW_t7')
    self.assertEqual(ticks.Scope(step), 'stage1_BW')
    for scope, want in (('stage1_BW_mb3', (1, 'BW', 3, None)),
                        ('stage1_BW_t7', (1, 'BW', None, 7)),
                        ('stage1_BW', (1, 'BW', None, None))):
      self.assertEqual(ticks.FindScope(f'while/body/_1/{scope}/MatMul'),
                       want)
    self.assertIsNone(ticks.FindScope('gradients/MatMul'))

  def testWhereNamesTheActionTickAndDeviceAndMarksItsRow(self):
    where = ticks.Where(self.program, 0, schedule.BW, 1)
    self.assertEqual((where.action, where.tick, where.device),
                     (schedule.Action(schedule.BW, 0, 1), 4, 0))
    self.assertEqual(str(where).splitlines(), [
        'BW of stage 0 on micro-batch 1 at tick 4 on device 0:',
        'dev 0: F0   F1   BW0  F2   !BW1 F3   BW2  BW3'])
    # A step built once for several ticks (a loop's body): the first.
    where = ticks.Where(self.program, 1, schedule.FB)
    self.assertEqual((where.tick, where.device), (1, 1))
    self.assertIn('the first of 4 actions it is built for', str(where))
    self.assertIn('dev 1: ..   !FB0', str(where))

  def testNamingRaisesAStepErrorFromTheOriginal(self):
    with self.assertRaises(ticks.StepError) as raised:
      with ticks.Naming(self.program, 1, schedule.FB, column=6):
        raise ValueError('shapes (4, 3) and (8, 8)')
    self.assertIsInstance(raised.exception.__cause__, ValueError)
    self.assertEqual(raised.exception.action,
                     schedule.Action(schedule.FB, 1, 3))
    self.assertRegex(str(raised.exception),
                     r'ValueError in FB of stage 1 on micro-batch 3 at tick 6 '
                     r'on device 1:\ndev 1: .*!FB3.*\nshapes \(4, 3\)')

  def testNamingKeepsAProjectErrorAndNotesWhere(self):

    class _Named(errors.Error, ValueError):
      pass

    with self.assertRaises(_Named) as raised:
      with ticks.Naming(self.program, 0, schedule.F, 2):
        raise _Named('what to change')
    self.assertIn('in F of stage 0 on micro-batch 2 at tick 3 on device 0',
                  raised.exception.__notes__[0])

  def testNamingFindsTheStepInTheMessageWithoutAStage(self):
    with self.assertRaisesRegex(ticks.StepError,
                                'BW of stage 0 on micro-batch 2 at tick 6'):
      with ticks.Naming(self.program):
        raise RuntimeError('[[node while/stage0_BW_mb2/MatMul]]')
    with self.assertRaises(KeyError):  # Names no step: goes on as it is.
      with ticks.Naming(self.program):
        raise KeyError('x')

  def testAmongNamesEveryActionItMayBeAndMarksThemAll(self):
    fbs = [schedule.Action(schedule.FB, 1, m) for m in range(4)]
    among = ticks.Among(self.program, fbs)
    self.assertEqual(among.actions, tuple(fbs))
    self.assertEqual(str(among).splitlines()[1],
                     'dev 1: ..   !FB0 !FB1 ..   !FB2 ..   !FB3 ..')
    self.assertTrue(str(among).startswith(
        'one of 4 actions, FB of stage 1 on micro-batch 0, 1, 2 or 3 at tick '
        '1, 2, 4 or 6 on device 1 ('))
    # One action is Where's.
    one = ticks.Among(self.program, fbs[2:3])
    self.assertEqual((one.action, one.tick, one.device), (fbs[2], 4, 1))
    self.assertEqual(str(one), str(ticks.Where(self.program, 1, 'FB', 2)))

  def testReceiptsAreScopedAndNameTheirSenders(self):
    self.assertEqual(ticks.ReceiptScope(1, 4), 'stage1_RECV_t4')
    self.assertEqual(ticks.FindScope('while/stage1_RECV/x'),
                     (1, ticks.RECV, None, None))
    # Stage 0 takes in FB0's gradient at tick 2, stage 1 F1's output at 2.
    self.assertEqual(ticks.Senders(self.program, 0, [2]),
                     [schedule.Action(schedule.FB, 1, 0)])
    self.assertEqual(ticks.Senders(self.program, 1, [2, 0]),
                     [schedule.Action(schedule.F, 0, 1)])

  def testExplainedKeepsAnOpErrorsTypeWithWhere(self):

    class _OpError(Exception):  # As tf.errors.InvalidArgumentError is built.

      def __init__(self, node_def, op, message):
        super().__init__(message)
        self.node_def, self.op, self.error_code = node_def, op, 3

    where = ticks.Where(self.program, 0, schedule.F, 2)
    error = _OpError(None, None, 'a NaN')
    explained = ticks.Explained(error, where)
    self.assertIsInstance(explained, _OpError)
    self.assertIs(explained.where, where)
    self.assertTrue(str(explained).startswith(
        '_OpError in F of stage 0 on micro-batch 2 at tick 3 on device 0:\n'))
    self.assertTrue(str(explained).endswith('\na NaN'))


if __name__ == '__main__':
  unittest.main()
