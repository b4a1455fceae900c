"""Tests for gpipe_tf.pipeline.schedule.library: the named schedules, by hand and by property."""

import collections
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import Action
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import vshape
from gpipe_tf.pipeline.schedule import ScheduleError

# The stages per device V each library schedule takes.
_VIRTUAL = {'gpipe': (1, 2, 3), '1f1b': (1,), 'interleaved_1f1b': (1, 2, 3),
            'zb_h1': (1,), 'zbv': (2,), 'dualpipe_v': (2,)}
_SPLIT = {'zb_h1', 'zbv'}  # Schedules that run every backward as B + W.
_MIXED = {'dualpipe_v'}  # Some backwards as BW, some as B + W.
_V_SHAPED = {'zbv', 'dualpipe_v'}  # Stage s on device min(s, 2K-1-s).


def _Labels(sched, device):
  """Device d's list as 'F0s1'-style labels."""
  return ' '.join(act.stage_label for act in sched.actions[device])


def _Cases():
  for name, vs in _VIRTUAL.items():
    for k in range(1, 6):
      # The V-shaped ones up to M = 16; dualpipe_v needs M >= 2K.
      for m in range(1, 17 if name in _V_SHAPED else 10):
        if name == 'dualpipe_v' and m < 2 * k:
          continue
        for v in vs:
          yield name, k, m, v


def _Placement(name, k, v):
  """The device of every stage: V-shaped or s % K."""
  if name in _V_SHAPED:
    return [min(s, 2 * k - 1 - s) for s in range(2 * k)]
  return [s % k for s in range(k * v)]


class RegistryTest(unittest.TestCase):

  def testNames(self):
    self.assertEqual(schedule.Names(), sorted(_VIRTUAL))

  def testUnknownNameListsRegistered(self):
    with self.assertRaises(ScheduleError) as ctx:
      schedule.Make('pipedream', 2, 2)
    for name in ['pipedream'] + list(_VIRTUAL):
      self.assertIn(name, str(ctx.exception))

  def testVirtualStagesOnlyWhereSupported(self):
    for name in ('1f1b', 'zb_h1'):
      with self.assertRaisesRegex(
          ScheduleError, 'num_virtual_stages=2 needs one of: dualpipe_v, gpipe, '
          'interleaved_1f1b, zbv$', msg=name):
        schedule.Make(name, 2, 4, 2)

  def testVShapedAreTheSchedulesThatTakeTwoStagesOnly(self):
    # schedule.V_SHAPED (what the tools give V = 2) names exactly the
    # registered schedules that refuse V = 1 and run V = 2.
    only_two = []
    for name in schedule.Names():
      try:
        schedule.Make(name, 2, 4, 1)
      except ScheduleError:
        schedule.Make(name, 2, 4, 2)
        only_two.append(name)
    self.assertCountEqual(schedule.V_SHAPED, only_two)

  def testBadSizes(self):
    for sizes in ((0, 1, 1), (1, 0, 1), (1, 1, 0), (-2, 3, 1), (2, 1.5, 1),
                  (True, 2, 1)):
      with self.assertRaisesRegex(ScheduleError, 'must be an int >= 1',
                                  msg=str(sizes)):
        schedule.Make('gpipe', *sizes)

  def testRegisterOwnSchedule(self):

    @schedule.Register('test_backward_first')
    def BackwardFirst(num_devices, num_micro_batches, num_virtual_stages=1):
      del num_virtual_stages
      rows = [[Action(kind, 0, 0) for kind in ('BW', 'F')]] + [
          [] for _ in range(num_devices - 1)]
      return schedule.Schedule(rows, num_micro_batches)

    registry = library._REGISTRY  # pylint: disable=protected-access
    self.addCleanup(registry.pop, 'test_backward_first')
    self.assertIn('test_backward_first', schedule.Names())
    # Make validates what the builder returns.
    with self.assertRaisesRegex(ScheduleError, 'runs later on the same device'):
      schedule.Make('test_backward_first', 1, 1)
    with self.assertRaisesRegex(ScheduleError, 'already registered'):
      schedule.Register('test_backward_first')(BackwardFirst)


class DocstringTest(unittest.TestCase):

  def testPicturesAreWhatToAsciiDraws(self):
    # pylint: disable=protected-access
    for name, doc in (('gpipe', library._GPipe.__doc__),
                      ('1f1b', library._OneFOneB.__doc__),
                      ('1f1b', schedule.table.__doc__),
                      ('zb_h1', library._ZeroBubbleH1.__doc__)):
      for row in schedule.Make(name, 3, 4).ToAscii().splitlines():
        self.assertIn(row, doc, msg=name)
    for name, k, m, doc in (('zbv', 2, 3, vshape._ZeroBubbleV.__doc__),
                            ('dualpipe_v', 2, 4, vshape._DualPipeV.__doc__)):
      for row in schedule.Make(name, k, m, 2).ToAscii().splitlines():
        self.assertIn(row, doc, msg=name)


class InvariantsTest(unittest.TestCase):
  """Every library schedule for K in 1..5, M in 1..9 and V in 1..3 where supported."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.schedules = {case: schedule.Make(*case) for case in _Cases()}

  def testEachPassOnceOnItsDevice(self):
    for (name, k, m, v), sched in self.schedules.items():
      self.assertEqual((sched.num_devices, sched.num_stages, sched.num_micro_batches,
                        sched.num_virtual_stages, sched.name), (k, k * v, m, v, name))
      msg = f'{name} K={k} M={m} V={v}'
      placement = _Placement(name, k, v)
      self.assertEqual(list(sched.stage_devices), placement, msg=msg)
      placed = collections.Counter(
          (act, d) for d, acts in enumerate(sched.actions) for act in acts)
      if name in _MIXED:  # Whichever backward each (s, m) runs, once.
        split = {(a.stage, a.micro_batch) for a, _ in placed if a.kind == 'B'}
      else:
        split = ({(s, b) for s in range(k * v) for b in range(m)}
                 if name in _SPLIT else set())
      expected = collections.Counter()
      for s in range(k * v):
        for b in range(m):
          kinds = ('F', 'B', 'W') if (s, b) in split else ('F', 'BW')
          expected.update((Action(kind, s, b), placement[s]) for kind in kinds)
      self.assertEqual(placed, expected, msg=msg)

  def testOrderFollowsDevicesAndDependencies(self):
    for case, sched in self.schedules.items():
      order = sched.Order()
      index = {act: i for i, act in enumerate(order)}
      self.assertEqual(len(index), sum(len(acts) for acts in sched.actions))
      for acts in sched.actions:
        positions = [index[act] for act in acts]
        self.assertEqual(positions, sorted(positions), msg=str(case))
      for act in order:
        for dep in sched.Dependencies(act):
          self.assertLess(index[dep], index[act], msg=f'{case} {act}')

  def testClocksRunEachPassForItsTicks(self):
    for case, sched in self.schedules.items():
      ticks = collections.Counter()
      for tick in sched.Clocks():
        self.assertEqual(len(tick), sched.num_devices)
        for d, act in enumerate(tick):
          if act is not None:
            self.assertEqual(sched.DeviceOf(act.stage), d, msg=str(case))
            ticks[act] += 1
      self.assertEqual(ticks, {act: 2 if act.kind == 'BW' else 1
                               for acts in sched.actions for act in acts},
                       msg=str(case))

  def testFillDrain(self):
    for (name, k, m, v), sched in self.schedules.items():
      if name == 'gpipe':
        self.assertTrue(sched.IsFillDrain(), msg=f'K={k} M={m} V={v}')
      elif v == 1:
        # The last device alternates F0 BW0 F1 ... from the start.
        self.assertEqual(sched.IsFillDrain(), m == 1, msg=f'{name} K={k} M={m}')
    # Interleaved: fill-drain when even the last device's warm-up, (V - 1) K,
    # covers all M V forwards but one.
    self.assertFalse(self.schedules['interleaved_1f1b', 2, 2, 2].IsFillDrain())
    self.assertTrue(self.schedules['interleaved_1f1b', 4, 1, 2].IsFillDrain())


class GPipeTest(unittest.TestCase):

  def testAscii(self):
    # Forward: device d runs F(m) at tick d + m. Backward, 2 ticks each, mirrors
    # it in reverse micro-batch order from tick M + K - 1 = 6 on.
    self.assertEqual(schedule.Make('gpipe', 3, 4).ToAscii(), '\n'.join([
        'dev 0: F0  F1  F2  F3  ..  ..  ..  ..  ..  ..  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0',
        'dev 1: ..  F0  F1  F2  F3  ..  ..  ..  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0 ..  ..',
        'dev 2: ..  ..  F0  F1  F2  F3  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0 ..  ..  ..  ..',
    ]))

  def testVirtualStagesGoStageMajor(self):
    sched = schedule.Make('gpipe', 2, 2, 2)
    self.assertEqual(_Labels(sched, 0),
                     'F0s0 F1s0 F0s2 F1s2 BW1s2 BW0s2 BW1s0 BW0s0')
    self.assertEqual(_Labels(sched, 1),
                     'F0s1 F1s1 F0s3 F1s3 BW1s3 BW0s3 BW1s1 BW0s1')


class OneFOneBTest(unittest.TestCase):

  def testAscii(self):
    # Device d warms up with K - d - 1 forwards; each backward waits for the
    # next device's, e.g. device 1's BW0 starts when device 2's ends (tick 5).
    self.assertEqual(schedule.Make('1f1b', 3, 4).ToAscii(), '\n'.join([
        'dev 0: F0  F1  F2  ..  ..  ..  ..  BW0 BW0 F3  BW1 BW1 ..  BW2 BW2 ..  BW3 BW3',
        'dev 1: ..  F0  F1  ..  ..  BW0 BW0 F2  BW1 BW1 F3  BW2 BW2 ..  BW3 BW3 ..  ..',
        'dev 2: ..  ..  F0  BW0 BW0 F1  BW1 BW1 F2  BW2 BW2 F3  BW3 BW3 ..  ..  ..  ..',
    ]))

  def testOrders(self):
    sched = schedule.Make('1f1b', 3, 4)
    self.assertEqual(_Labels(sched, 0), 'F0s0 F1s0 F2s0 BW0s0 F3s0 BW1s0 BW2s0 BW3s0')
    self.assertEqual(_Labels(sched, 2), 'F0s2 BW0s2 F1s2 BW1s2 F2s2 BW2s2 F3s2 BW3s2')
    # M = 2 < K - 1 = 3: device 0 forwards both micro-batches, never alternates.
    self.assertEqual(_Labels(schedule.Make('1f1b', 4, 2), 0), 'F0s0 F1s0 BW0s0 BW1s0')

  def testPeakInFlight(self):
    for k in range(1, 6):
      for m in range(1, 10):
        one_f_one_b = schedule.Simulate(schedule.Make('1f1b', k, m))
        gpipe = schedule.Simulate(schedule.Make('gpipe', k, m))
        self.assertEqual(one_f_one_b.peak_in_flight,
                         [min(k - d, m) for d in range(k)], msg=f'K={k} M={m}')
        self.assertEqual(gpipe.peak_in_flight, [m] * k, msg=f'K={k} M={m}')


class InterleavedTest(unittest.TestCase):

  def testMegatronOrder(self):
    # K = 2, M = 4, V = 2: device d holds stages d (chunk 0) and d + 2 (chunk 1).
    # Forward order, groups of K = 2 micro-batches chunk by chunk:
    #   (m, chunk) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1);
    # backward: the same with chunks mirrored. Warm-up 2 (K - d - 1) + (V - 1) K:
    # 4 forwards on device 0, 2 on device 1; then F/BW pairs; then the rest.
    sched = schedule.Make('interleaved_1f1b', 2, 4, 2)
    self.assertEqual(_Labels(sched, 0), ' '.join([
        'F0s0 F1s0 F0s2 F1s2',
        'F2s0 BW0s2 F3s0 BW1s2 F2s2 BW0s0 F3s2 BW1s0',
        'BW2s2 BW3s2 BW2s0 BW3s0']))
    self.assertEqual(_Labels(sched, 1), ' '.join([
        'F0s1 F1s1',
        'F0s3 BW0s3 F1s3 BW1s3 F2s1 BW0s1 F3s1 BW1s1 F2s3 BW2s3 F3s3 BW3s3',
        'BW2s1 BW3s1']))

  def testWarmupCount(self):
    for k in range(2, 5):
      for v in (2, 3):
        for m in range(k, 9, k):
          sched = schedule.Make('interleaved_1f1b', k, m, v)
          for d, acts in enumerate(sched.actions):
            leading = next(i for i, act in enumerate(acts) if act.kind == 'BW')
            warmup = min(2 * (k - d - 1) + (v - 1) * k, m * v)
            # The warm-up forwards, then the first forward of the steady pairs.
            self.assertEqual(leading, min(warmup + 1, m * v),
                             msg=f'K={k} M={m} V={v} device {d}')

  def testOneVirtualStageIs1F1B(self):
    for k in range(1, 6):
      for m in range(1, 10):
        self.assertEqual(schedule.Make('interleaved_1f1b', k, m, 1),
                         schedule.Make('1f1b', k, m), msg=f'K={k} M={m}')

  def testUnevenMicroBatchesStayWithinMegatronsPeak(self):
    # K = 4, M = 5, V = 3 is a case where Megatron's strict alternation deadlocks.
    for k, m, v in ((4, 5, 3), (3, 4, 2), (5, 7, 2), (4, 2, 3), (5, 1, 2)):
      sched = schedule.Make('interleaved_1f1b', k, m, v)
      peaks = schedule.Simulate(sched).peak_in_flight
      for d in range(k):
        self.assertLessEqual(
            peaks[d], min(2 * (k - d - 1) + (v - 1) * k + 1, m * v),
            msg=f'K={k} M={m} V={v} device {d}')

  def testMegatronBubble(self):
    for k in range(1, 6):
      for v in (2, 3):
        for m in range(k, 10, k):
          result = schedule.Simulate(schedule.Make('interleaved_1f1b', k, m, v))
          self.assertAlmostEqual(result.bubble_fraction, (k - 1) / (v * m + k - 1),
                                 msg=f'K={k} M={m} V={v}')

  def testSmallerBubbleThan1F1B(self):
    for k in range(2, 6):
      for v in (2, 3):
        for m in range(k, 10, k):
          # Same total work: each of the V stages per device costs 1/V.
          interleaved = schedule.Simulate(
              schedule.Make('interleaved_1f1b', k, m, v), 1 / v, 1 / v, 1 / v)
          one_f_one_b = schedule.Simulate(schedule.Make('1f1b', k, m))
          self.assertLess(interleaved.bubble_fraction, one_f_one_b.bubble_fraction,
                          msg=f'K={k} M={m} V={v}')
          self.assertLess(interleaved.makespan, one_f_one_b.makespan)


class ZeroBubbleH1Test(unittest.TestCase):

  def testAscii(self):
    # Device d: 1F1B's order with B for BW, and W(i) right after B(i + d).
    self.assertEqual(schedule.Make('zb_h1', 3, 4).ToAscii(), '\n'.join([
        'dev 0: F0 F1 F2 .. .. B0 W0 F3 B1 W1 B2 W2 B3 W3',
        'dev 1: .. F0 F1 .. B0 F2 B1 W0 F3 B2 W1 B3 W2 W3',
        'dev 2: .. .. F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3',
    ]))

  def testBubbleAndMemoryAgainst1F1B(self):
    zb_h1 = schedule.Simulate(schedule.Make('zb_h1', 4, 8))
    one_f_one_b = schedule.Simulate(schedule.Make('1f1b', 4, 8))
    self.assertLess(zb_h1.bubble_fraction, one_f_one_b.bubble_fraction)
    self.assertEqual(max(zb_h1.peak_in_flight), max(one_f_one_b.peak_in_flight))

  def testPaperBubble(self):
    # Qi et al.: with F = B = W, 1F1B idles 3 (K - 1) ticks per device and ZB-H1
    # K - 1, once M >= K. Every device holds min(K, M) micro-batches at its peak.
    for k in range(1, 6):
      for m in range(1, 10):
        zb_h1 = schedule.Simulate(schedule.Make('zb_h1', k, m))
        self.assertEqual(zb_h1.peak_in_flight, [min(k, m)] * k, msg=f'K={k} M={m}')
        if m >= k:
          self.assertEqual(zb_h1.makespan, 3 * m + k - 1, msg=f'K={k} M={m}')
          one_f_one_b = schedule.Simulate(schedule.Make('1f1b', k, m))
          self.assertEqual(one_f_one_b.makespan, 3 * (m + k - 1))


class VShapeTest(unittest.TestCase):
  """zbv and dualpipe_v: V-shaped placement, PyTorch's orders, their bubbles."""

  def testPlacementIsAV(self):
    self.assertEqual(schedule.VStageDevices(3), [0, 1, 2, 2, 1, 0])
    for name, m in (('zbv', 1), ('dualpipe_v', 8)):
      for k in range(1, 5):
        sched = schedule.Make(name, k, m, 2)
        self.assertEqual(sched.num_virtual_stages, 2)
        for d in range(k):
          self.assertEqual(sched.StagesOn(d), [d, 2 * k - 1 - d], msg=name)

  def testTwoStagesPerDeviceOnly(self):
    for name in ('zbv', 'dualpipe_v'):
      for v in (1, 3):
        with self.assertRaisesRegex(
            ScheduleError, f"'{name}' folds the pipeline into a V .* set "
            f'num_virtual_stages=2, got {v}$', msg=name):
          schedule.Make(name, 2, 8, v)

  def testDualPipeVNeedsTwoMicroBatchesPerDevice(self):
    with self.assertRaisesRegex(
        ScheduleError, r'needs num_micro_batches >= 2 \* num_devices = 6 .*'
        'got 5'):
      schedule.Make('dualpipe_v', 3, 5, 2)
    self.assertEqual(schedule.Make('dualpipe_v', 3, 6, 2).num_micro_batches, 6)

  def testZbvOrders(self):
    # K = 2, M = 4. Device 0 (stages 0 down, 3 up): 2(K-d)-1 = 3 forwards down;
    # K-d = 2 x (F, B, W up); steady (F down, B W down, F B W up) while
    # forwards remain; then K-d = 2 x (B, W down).
    sched = schedule.Make('zbv', 2, 4, 2)
    self.assertEqual(_Labels(sched, 0), ' '.join([
        'F0s0 F1s0 F2s0', 'F0s3 B0s3 W0s3 F1s3 B1s3 W1s3',
        'F3s0 B0s0 W0s0 F2s3 B2s3 W2s3', 'B1s0 W1s0 F3s3 B3s3 W3s3',
        'B2s0 W2s0 B3s0 W3s0']))
    # Device 1 (stages 1, 2): 1 forward down; d = 1 x (F up, F down); 1 x (F,
    # B, W up); steady; then d x (B down, B up), 1 x (B, W down), the last Ws.
    self.assertEqual(_Labels(sched, 1), ' '.join([
        'F0s1', 'F0s2 F1s1', 'F1s2 B0s2 W0s2',
        'F2s1 B0s1 W0s1 F2s2 B1s2 W1s2', 'F3s1 B1s1 W1s1 F3s2 B2s2 W2s2',
        'B2s1 B3s2', 'B3s1 W2s1', 'W3s2', 'W3s1']))

  def testDualPipeVOrders(self):
    # K = 2, M = 4, the steps of the builder's docstring; step 4 and 5 pair a
    # forward with a whole backward (PyTorch's OVERLAP_F_B).
    sched = schedule.Make('dualpipe_v', 2, 4, 2)
    self.assertEqual(_Labels(sched, 0), ' '.join([
        'F0s0 F1s0', 'F2s0 F0s3', 'B0s3 W0s3 F1s3', 'F3s0 BW1s3 F2s3 BW0s0',
        'BW2s3 F3s3 BW1s0', 'BW3s3 B2s0', 'W2s0 B3s0', 'W3s0']))
    self.assertEqual(_Labels(sched, 1), ' '.join([
        'F0s1 F0s2 F1s1 F1s2', 'F2s1 BW0s2 F2s2 BW0s1 F3s1 BW1s2 F3s2 BW1s1',
        'BW2s2 BW2s1 B3s2 B3s1', 'W3s2 W3s1']))

  def testZbvBubbleAndPeak(self):
    # With F = B = W, once M >= 2K - 1 every device idles K - 1 ticks and holds
    # 2K stage-micro-batches (K micro-batches of its layers) at its peak.
    for k in range(1, 6):
      for m in range(2 * k - 1, 17):
        result = schedule.Simulate(schedule.Make('zbv', k, m, 2))
        msg = f'K={k} M={m}'
        self.assertEqual([result.makespan - b for b in result.busy],
                         [k - 1] * k, msg=msg)
        self.assertAlmostEqual(result.bubble_fraction,
                               (k - 1) / (6 * m + k - 1), msg=msg)
        self.assertEqual(result.peak_in_flight, [2 * k] * k, msg=msg)

  def testSmallerBubbleThan1F1BAndZbH1(self):
    # Same total work: each of the 2 stages per device costs 1/2.
    for k in range(2, 6):
      for m in range(1, 17):
        zbv = schedule.Simulate(schedule.Make('zbv', k, m, 2), .5, .5, .5)
        one_f_one_b = schedule.Simulate(schedule.Make('1f1b', k, m))
        zb_h1 = schedule.Simulate(schedule.Make('zb_h1', k, m))
        msg = f'K={k} M={m}'
        self.assertLess(zbv.bubble_fraction, one_f_one_b.bubble_fraction, msg)
        self.assertLess(zbv.makespan, one_f_one_b.makespan, msg)
        self.assertLessEqual(zbv.makespan, zb_h1.makespan, msg)
        if m >= 2 * k - 1:
          self.assertLess(zbv.bubble_fraction, zb_h1.bubble_fraction, msg)

  def testDualPipeVTimesLikeZbv(self):
    # Unit times cannot show what overlapping F with BW gains on a GPU: the
    # makespan is ZB-V's; the peak one stage-micro-batch more.
    for k in range(1, 5):
      for m in range(2 * k, 17):
        dual = schedule.Simulate(schedule.Make('dualpipe_v', k, m, 2))
        zbv = schedule.Simulate(schedule.Make('zbv', k, m, 2))
        self.assertEqual(dual.makespan, zbv.makespan, msg=f'K={k} M={m}')
        self.assertEqual(dual.peak_in_flight, [2 * k + 1] * k)


if __name__ == '__main__':
  unittest.main()
