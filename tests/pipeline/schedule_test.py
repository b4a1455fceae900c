"""Tests for gpipe_tf.pipeline.schedule's Action and Schedule: checks, dependencies, grid."""

import dataclasses
import pathlib
import unittest

from gpipe_tf import errors
from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import Action
from gpipe_tf.pipeline.schedule import Schedule
from gpipe_tf.pipeline.schedule import ScheduleError


def Fwd(s, m):
  return Action(schedule.F, s, m)


def Bwd(s, m):
  return Action(schedule.BW, s, m)


def InGrad(s, m):
  return Action(schedule.B, s, m)


def WGrad(s, m):
  return Action(schedule.W, s, m)


def TwoStage(dev0=None, dev1=None, **kwargs):
  """1F1B by hand for K = 2, M = 2, or the given device lists."""
  dev0 = [Fwd(0, 0), Fwd(0, 1), Bwd(0, 0), Bwd(0, 1)] if dev0 is None else dev0
  dev1 = [Fwd(1, 0), Bwd(1, 0), Fwd(1, 1), Bwd(1, 1)] if dev1 is None else dev1
  return Schedule([dev0, dev1], kwargs.pop('num_micro_batches', 2), **kwargs)


class ActionTest(unittest.TestCase):

  def testLabelsAndStr(self):
    act = Bwd(1, 3)
    self.assertEqual(act.label, 'BW3')
    self.assertEqual(act.stage_label, 'BW3s1')
    self.assertEqual(str(act), 'BW(stage=1, micro_batch=3)')
    self.assertEqual(Fwd(0, 12).label, 'F12')

  def testFrozenOrderedHashable(self):
    with self.assertRaises(dataclasses.FrozenInstanceError):
      Fwd(0, 0).stage = 1
    self.assertEqual(sorted([Fwd(1, 0), Bwd(0, 1), Fwd(0, 2)]),
                     [Bwd(0, 1), Fwd(0, 2), Fwd(1, 0)])
    self.assertEqual({Fwd(0, 1): 'x'}[Action('F', 0, 1)], 'x')

  def testBadFields(self):
    with self.assertRaisesRegex(ScheduleError, "one of F, B, W, BW; got 'X'"):
      Action('X', 0, 0)
    for stage, micro_batch in ((-1, 0), (0, -1), (0.5, 0), (True, 0)):
      with self.assertRaises(ScheduleError, msg=f'{stage}, {micro_batch}'):
        Action('F', stage, micro_batch)

  def testErrorFamily(self):
    self.assertTrue(issubclass(ScheduleError, errors.Error))
    self.assertTrue(issubclass(ScheduleError, ValueError))


class PurityTest(unittest.TestCase):

  def testNoModuleImportsTensorFlow(self):
    package = pathlib.Path(schedule.__file__).parent
    modules = sorted(package.glob('*.py'))
    self.assertGreaterEqual(len(modules), 7, msg=str(package))
    for path in modules:
      text = path.read_text(encoding='utf-8')
      self.assertNotIn('import tensorflow', text, msg=path.name)
      self.assertNotIn('from tensorflow', text, msg=path.name)
      self.assertTrue(text.startswith('"""'), msg=f'{path.name} has no docstring')


class ScheduleTest(unittest.TestCase):

  def testProperties(self):
    sched = TwoStage()
    self.assertEqual((sched.num_devices, sched.num_stages, sched.num_micro_batches,
                      sched.num_virtual_stages), (2, 2, 2, 1))
    self.assertEqual(sched.stage_devices, (0, 1))
    self.assertEqual(sched.name, 'custom')
    self.assertEqual(sched.actions[1], (Fwd(1, 0), Bwd(1, 0), Fwd(1, 1), Bwd(1, 1)))
    self.assertEqual(sched.DeviceOf(1), 1)
    self.assertEqual(sched.StagesOn(0), [0])
    with self.assertRaisesRegex(ScheduleError, r'stage must be in \[0, 2\)'):
      sched.DeviceOf(2)
    with self.assertRaisesRegex(ScheduleError, r'device must be in \[0, 2\)'):
      sched.StagesOn(-1)

  def testDefaultPlacementLoopsOverDevices(self):
    dev0 = [Fwd(0, 0), Fwd(2, 0), Bwd(2, 0), Bwd(0, 0)]
    dev1 = [Fwd(1, 0), Fwd(3, 0), Bwd(3, 0), Bwd(1, 0)]
    sched = Schedule([dev0, dev1], 1)
    self.assertEqual(sched.stage_devices, (0, 1, 0, 1))
    self.assertEqual(sched.StagesOn(0), [0, 2])
    self.assertEqual(sched.num_virtual_stages, 2)
    sched.Validate()

  def testExplicitPlacement(self):
    # Stage 0 on device 1 and stage 1 on device 0; device 2 holds nothing.
    sched = Schedule([[Fwd(1, 0), Bwd(1, 0)], [Fwd(0, 0), Bwd(0, 0)], []], 1,
                     stage_devices=[1, 0])
    sched.Validate()
    self.assertEqual(sched.StagesOn(2), [])
    self.assertEqual(sched.num_devices, 3)

  def testConstructorErrors(self):
    with self.assertRaisesRegex(ScheduleError, 'one action list per device'):
      Schedule([], 1)
    with self.assertRaisesRegex(ScheduleError,
                                r"actions\[0\]\[1\] is \('F', 0, 1\), not an Action"):
      Schedule([[Fwd(0, 0), ('F', 0, 1)]], 2)
    with self.assertRaisesRegex(ScheduleError, 'num_micro_batches must be an int >= 1'):
      TwoStage(num_micro_batches=0)
    with self.assertRaisesRegex(ScheduleError, 'has no actions'):
      Schedule([[], []], 1)
    with self.assertRaisesRegex(ScheduleError, r'stage_devices\[1\] = 2 but'):
      TwoStage(stage_devices=[0, 2])

  def testDependencies(self):
    sched = TwoStage()
    self.assertEqual(sched.Dependencies(Fwd(0, 0)), [])
    self.assertEqual(sched.Dependencies(Fwd(1, 1)), [Fwd(0, 1)])
    self.assertEqual(sched.Dependencies(Bwd(1, 0)), [Fwd(1, 0)])
    self.assertEqual(sched.Dependencies(Bwd(0, 1)), [Fwd(0, 1), Bwd(1, 1)])
    with self.assertRaisesRegex(ScheduleError, 'outside this schedule'):
      sched.Dependencies(Fwd(2, 0))
    with self.assertRaisesRegex(ScheduleError, 'outside this schedule'):
      sched.Dependencies(Fwd(0, 2))

  def testDependenciesWithADeferredW(self):
    # Stage 1 splits its backward of micro-batch 0 only.
    dev1 = [Fwd(1, 0), InGrad(1, 0), Fwd(1, 1), Bwd(1, 1), WGrad(1, 0)]
    sched = TwoStage(dev1=dev1)
    sched.Validate()
    self.assertTrue(sched.DefersW(1, 0))
    self.assertFalse(sched.DefersW(1, 1))
    self.assertFalse(sched.DefersW(0, 0))
    self.assertEqual(sched.Dependencies(Bwd(0, 0)), [Fwd(0, 0), InGrad(1, 0)])
    self.assertEqual(sched.Dependencies(Bwd(0, 1)), [Fwd(0, 1), Bwd(1, 1)])
    self.assertEqual(sched.Dependencies(WGrad(1, 0)), [InGrad(1, 0)])
    self.assertEqual(sched.Dependencies(InGrad(1, 0)), [Fwd(1, 0)])

  def testFusedForwardAndBackward(self):
    # The last stage's pairs as FB (ticks.FuseLast); micro-batch 0 splits
    # its backward: a W follows its FB.
    fused = lambda m: Action(schedule.FB, 1, m)
    sched = TwoStage(dev1=[fused(0), fused(1), WGrad(1, 0)])
    sched.Validate()
    self.assertTrue(sched.DefersW(1, 0))
    self.assertFalse(sched.DefersW(1, 1))
    self.assertEqual(sched.Dependencies(fused(0)), [Fwd(0, 0)])
    # What stage 0 reads from a fused pair comes from its FB.
    self.assertEqual(sched.Dependencies(Bwd(0, 1)), [Fwd(0, 1), fused(1)])
    self.assertEqual(sched.Dependencies(WGrad(1, 0)), [fused(0)])
    self.assertEqual(sched.ForwardsFollowedByBackward(), {(1, 0), (1, 1)})
    # FB(1, 0) takes F's tick and B's; FB(1, 1) F's and BW's two.
    self.assertEqual(sched.ToAscii().splitlines()[1].split()[2:],
                     ['..', 'FB0', 'FB0', 'FB1', 'FB1', 'FB1', 'W0', '..'])
    for rival in (Fwd(1, 1), Bwd(1, 1), InGrad(1, 1)):
      with self.subTest(rival=str(rival)):
        with self.assertRaisesRegex(ScheduleError, 'runs beside an FB'):
          TwoStage(dev1=[fused(0), fused(1), rival]).Validate()
    with self.assertRaisesRegex(ScheduleError, 'holds an F and backward that '
                                r'run apart.*has F\(stage=1, micro_batch=0\)'):
      TwoStage(dev1=[Fwd(1, 0), fused(0), fused(1)]).Validate()

  def testClocksAndOrder(self):
    # Unit replay by hand: device 1 runs F(1,0) at tick 1, BW(1,0) at 2-3, F(1,1)
    # at 4, BW(1,1) at 5-6; device 0 waits for BW(1,0) (ends at 4) and BW(1,1)
    # (ends at 7).
    sched = TwoStage()
    self.assertEqual(sched.Clocks(), [
        [Fwd(0, 0), None],
        [Fwd(0, 1), Fwd(1, 0)],
        [None, Bwd(1, 0)],
        [None, Bwd(1, 0)],
        [Bwd(0, 0), Fwd(1, 1)],
        [Bwd(0, 0), Bwd(1, 1)],
        [None, Bwd(1, 1)],
        [Bwd(0, 1), None],
        [Bwd(0, 1), None],
    ])
    self.assertEqual(sched.Order(), [Fwd(0, 0), Fwd(0, 1), Fwd(1, 0), Bwd(1, 0),
                                     Bwd(0, 0), Fwd(1, 1), Bwd(1, 1), Bwd(0, 1)])
    self.assertEqual(sched.ToAscii(), '\n'.join([
        'dev 0: F0  F1  ..  ..  BW0 BW0 ..  BW1 BW1',
        'dev 1: ..  F0  BW0 BW0 F1  BW1 BW1 ..  ..',
    ]))

  def testAsciiLabelsStagesWhenADeviceHoldsSeveral(self):
    sched = Schedule([[Fwd(0, 0), Fwd(1, 0), Bwd(1, 0), Bwd(0, 0)]], 1)
    self.assertEqual(sched.ToAscii(),
                     'dev 0: F0s0  F0s1  BW0s1 BW0s1 BW0s0 BW0s0')

  def testAsciiPadsDeviceNumbers(self):
    sched = Schedule([[Fwd(d, 0), Bwd(d, 0)] if d == 0 else [] for d in range(11)],
                     1)
    rows = sched.ToAscii().splitlines()
    self.assertEqual(rows[0], 'dev  0: F0  BW0 BW0')
    self.assertEqual(rows[10], 'dev 10: ..  ..  ..')

  def testIsFillDrain(self):
    self.assertFalse(TwoStage().IsFillDrain())
    gpipe = TwoStage(dev1=[Fwd(1, 0), Fwd(1, 1), Bwd(1, 1), Bwd(1, 0)])
    self.assertTrue(gpipe.IsFillDrain())
    split = Schedule([[Fwd(0, 0), InGrad(0, 0), Fwd(0, 1), WGrad(0, 0),
                       InGrad(0, 1), WGrad(0, 1)]], 2)
    self.assertFalse(split.IsFillDrain())

  def testForwardsFollowedByBackwardGPipe(self):
    # GPipe runs each device's backwards in reverse micro-batch order, so the
    # last micro-batch's BW comes right after its F on every stage (V = 1).
    sched = schedule.Make('gpipe', num_devices=2, num_micro_batches=4)
    self.assertEqual(sched.ForwardsFollowedByBackward(), {(0, 3), (1, 3)})
    # With V = 2, F(0, 3) is followed by F(2, 0) on device 0: only each
    # device's last stage keeps its last micro-batch adjacent.
    sched = schedule.Make('gpipe', 2, 4, num_virtual_stages=2)
    self.assertEqual(sched.ForwardsFollowedByBackward(), {(2, 3), (3, 3)})

  def testForwardsFollowedByBackward1F1B(self):
    for k in (2, 3):
      sched = schedule.Make('1f1b', num_devices=k, num_micro_batches=4)
      self.assertEqual(sched.ForwardsFollowedByBackward(),
                       {(k - 1, m) for m in range(4)}, k)

  def testForwardsFollowedByBackwardCountsADeferredW(self):
    sched = schedule.Make('zb_h1', num_devices=2, num_micro_batches=3)
    self.assertEqual(sched.ForwardsFollowedByBackward(),
                     {(1, m) for m in range(3)})

  def testForwardsFollowedByBackwardNeedsTheSamePairNext(self):
    # F(1, 0) BW(1, 1): a backward follows, but of another micro-batch; F(0, 1)
    # is followed by the BW of stage 1 only in Order(), not on its device.
    dev0 = [Fwd(0, 0), Fwd(0, 1), Bwd(0, 0), Bwd(0, 1)]
    dev1 = [Fwd(1, 0), Fwd(1, 1), Bwd(1, 1), Bwd(1, 0)]
    sched = TwoStage(dev0, dev1)
    self.assertEqual(sched.ForwardsFollowedByBackward(), {(1, 1)})
    dev1 = [Fwd(1, 0), Fwd(1, 1), Bwd(1, 0), Bwd(1, 1)]
    self.assertEqual(TwoStage(dev0, dev1).ForwardsFollowedByBackward(), set())
    # A W, or an F of another stage on the same device, in between.
    split = Schedule([[Fwd(0, 0), InGrad(0, 0), Fwd(0, 1), WGrad(0, 0),
                       InGrad(0, 1), WGrad(0, 1)]], 2)
    self.assertEqual(split.ForwardsFollowedByBackward(), {(0, 0)})
    looped = Schedule([[Fwd(0, 0), Fwd(1, 0), Bwd(1, 0), Bwd(0, 0)]], 1)
    self.assertEqual(looped.ForwardsFollowedByBackward(), {(1, 0)})

  def testEqualityHashAndRepr(self):
    self.assertEqual(TwoStage(), TwoStage(name='other'))
    self.assertEqual(hash(TwoStage()), hash(TwoStage(name='other')))
    self.assertNotEqual(TwoStage(), TwoStage(num_micro_batches=3))
    self.assertNotEqual(TwoStage(), TwoStage(stage_devices=[0, 1, 0]))
    self.assertNotEqual(TwoStage(), 'TwoStage')
    self.assertEqual(repr(TwoStage(name='x')),
                     "Schedule(name='x', num_devices=2, num_stages=2, "
                     'num_micro_batches=2)')


class ValidateTest(unittest.TestCase):
  """Each bad schedule is named by its first bad step, with the grid up to it."""

  def assertBadStep(self, sched, device, position, *fragments):
    with self.assertRaises(ScheduleError) as ctx:
      sched.Validate()
    message = str(ctx.exception)
    self.assertIn(f'device {device}, position {position}: '
                  f'{sched.actions[device][position]} ', message)
    for fragment in fragments:
      self.assertIn(fragment, message)
    self.assertEqual((ctx.exception.device, ctx.exception.position),
                     (device, position))
    return message

  def testSwappedPairOnOneDeviceDeadlocks(self):
    sched = TwoStage(dev1=[Bwd(1, 0), Fwd(1, 0), Fwd(1, 1), Bwd(1, 1)])
    message = self.assertBadStep(
        sched, 1, 0, 'deadlocks: it waits for F(stage=1, micro_batch=0), which '
        'runs later on the same device (position 1)')
    # Device 0 ran both forwards, then waits; device 1 never started.
    self.assertTrue(message.endswith('dev 0: F0   F1\ndev 1: !BW0 ..'), message)

  def testCycleAcrossDevicesDeadlocks(self):
    # Device 0 wants BW(1,0) before it sends F(0,1); device 1 wants F(0,1)
    # before it runs BW(1,0).
    sched = TwoStage(dev0=[Fwd(0, 0), Bwd(0, 0), Fwd(0, 1), Bwd(0, 1)],
                     dev1=[Fwd(1, 0), Fwd(1, 1), Bwd(1, 0), Bwd(1, 1)])
    message = self.assertBadStep(
        sched, 0, 1, 'it waits for BW(stage=1, micro_batch=0) (device 1, '
        'position 2), which never starts: device 1 is itself stuck at position 1 '
        'on F(stage=1, micro_batch=1)')
    self.assertIn('dev 0: F0   !BW0\ndev 1: ..   F0', message)

  def testActionOnWrongDevice(self):
    sched = TwoStage(dev0=[Fwd(0, 0), Fwd(0, 1), Bwd(0, 0), Bwd(1, 1), Bwd(0, 1)],
                     dev1=[Fwd(1, 0), Bwd(1, 0), Fwd(1, 1)])
    message = self.assertBadStep(
        sched, 0, 3, 'is on the wrong device: stage 1 is placed on device 1 '
        '(stage_devices[1])')
    self.assertIn('!BW1', message.splitlines()[1])

  def testMissingBackwardThatOthersWaitFor(self):
    sched = TwoStage(dev1=[Fwd(1, 0), Bwd(1, 0), Fwd(1, 1)])
    self.assertBadStep(sched, 0, 3, 'waits for BW(stage=1, micro_batch=1), which '
                       'no device runs')

  def testMissingBackwardThatNobodyWaitsFor(self):
    sched = TwoStage(dev0=[Fwd(0, 0), Fwd(0, 1), Bwd(0, 0)])
    self.assertBadStep(sched, 0, 1, 'has no backward; add BW(stage=0, '
                       'micro_batch=1) (or B and W)')

  def testMissingWeightGradient(self):
    sched = TwoStage(dev1=[Fwd(1, 0), InGrad(1, 0), Fwd(1, 1), Bwd(1, 1)])
    self.assertBadStep(sched, 1, 1, 'has no matching W(stage=1, micro_batch=0)')

  def testMissingMicroBatch(self):
    with self.assertRaisesRegex(ScheduleError,
                                'stage 0, micro-batch 2 has no F; device 0 must'):
      TwoStage(num_micro_batches=3).Validate()

  def testDuplicate(self):
    sched = TwoStage(dev0=[Fwd(0, 0), Fwd(0, 1), Bwd(0, 0), Bwd(0, 1), Fwd(0, 1)])
    self.assertBadStep(sched, 0, 4, 'is a duplicate of device 0, position 1')

  def testMixedBackward(self):
    sched = TwoStage(dev1=[Fwd(1, 0), InGrad(1, 0), Bwd(1, 0), WGrad(1, 0),
                           Fwd(1, 1), Bwd(1, 1)])
    self.assertBadStep(sched, 1, 2, 'mixes BW with B/W', 'position 1 has '
                       'B(stage=1, micro_batch=0)')

  def testOutOfRange(self):
    sched = TwoStage(dev1=[Fwd(1, 0), Bwd(1, 0), Fwd(1, 2), Fwd(1, 1), Bwd(1, 1)])
    self.assertBadStep(sched, 1, 2, 'has micro-batch 2, out of range')
    sched = TwoStage(dev1=[Fwd(1, 0), Bwd(1, 0), Fwd(3, 0)], stage_devices=[0, 1])
    self.assertBadStep(sched, 1, 2, 'has stage 3, out of range')

  def testOtherMethodsValidateFirst(self):
    sched = TwoStage(dev1=[Bwd(1, 0), Fwd(1, 0), Fwd(1, 1), Bwd(1, 1)])
    for method in (sched.Order, sched.Clocks, sched.ToAscii):
      with self.assertRaisesRegex(ScheduleError, 'deadlocks', msg=method.__name__):
        method()


if __name__ == '__main__':
  unittest.main()
