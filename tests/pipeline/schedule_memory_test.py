"""schedule/memory.py: the bytes each device holds over a schedule's step, on small cases computed by hand."""

from absl.testing import absltest

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import ticks

# Per micro-batch: input 1, activations 4 (a kept forward holds 5), wcut 8.
_STAGE = memory.StageBytes(input=1, activations=4, wcut=8)


def _Profile(name, k=2, m=4, remat='never', v=1, stage=_STAGE):
  sched = schedule_lib.Make(name, k, m, v)
  return memory.Profile(sched, [stage] * sched.num_stages,
                        memory.KeptForwards(sched, remat))


class ProfileTest(absltest.TestCase):

  def testGPipeHoldsEveryMicroBatch(self):
    # dev 0: F0 F1 F2 F3 .. .. .. BW3 BW3 ...: 4 x 5 from F3 (t = 3) to the
    # end of BW3 (t = 9); dev 1 from F3 (t = 4) to the end of its BW3 (t = 7).
    prof = _Profile('gpipe')
    self.assertEqual(prof.step_peak, (20, 20))
    self.assertEqual(prof.total_step_peak, 40)
    self.assertEqual(prof.worst_time, 4)
    self.assertEqual(_Profile('gpipe', m=8).step_peak, (40, 40))

  def testOneFOneBHoldsAtMostKMinusDOnDeviceD(self):
    self.assertEqual(_Profile('1f1b').step_peak, (10, 5))
    self.assertEqual(_Profile('1f1b', k=4, m=8).step_peak, (20, 15, 10, 5))
    # At most K on stage 0, whatever M.
    self.assertEqual(_Profile('1f1b', k=4, m=16).step_peak[0], 20)

  def testRematHoldsBoundariesAndOneRecompute(self):
    # GPipe 'always': dev 0 keeps F3 (BW3 follows it), the others hold their
    # input only: 4 inputs + 4 activations while BW3 runs, and while BW2
    # recomputes, 3 inputs + 4 rebuilt activations.
    prof = _Profile('gpipe', remat='always')
    self.assertEqual(prof.step_peak, (8, 8))
    # 'except_last' keeps micro-batch 3 too: the same here.
    self.assertEqual(_Profile('gpipe', remat='except_last').step_peak, (8, 8))
    # With M = 8: 8 inputs + one stage's activations, not 8 x 5.
    self.assertEqual(_Profile('gpipe', m=8, remat='always').step_peak,
                     (12, 12))

  def testPinnedValuesAreHeldByARecomputedForward(self):
    stage = memory.StageBytes(input=1, activations=4, pinned=2)
    prof = _Profile('gpipe', remat='always', stage=stage)
    # dev 0 at the end of its forwards: 3 x (1 + 2) + the kept F3's 5.
    self.assertEqual(prof.step_peak, (14, 14))

  def testZbH1HoldsTheWcutOfDeferredWeightGradients(self):
    # dev 1: .. F0 B0 F1 B1 W0 F2 B2 W1 ...: after B1 (t = 5) it holds the
    # wcut of W0 (deferred) and of W1: 2 x 8.
    self.assertEqual(_Profile('zb_h1').step_peak[1], 16)
    # Without wcut, one micro-batch at a time (5): the wcut is what costs.
    no_wcut = memory.StageBytes(input=1, activations=4)
    self.assertEqual(_Profile('zb_h1', stage=no_wcut).step_peak, (10, 5))
    # dev 0 runs each W right after its B: one wcut, beside F's held 1F1B
    # micro-batches, at most 2 x 5 as 1F1B's (at t = 4: 5 + wcut 8).
    self.assertEqual(_Profile('zb_h1').step_peak[0], 13)

  def testBWReleasesWhatABHandsToW(self):
    # A combined BW holds no wcut at all: wcut does not change 1F1B.
    big = memory.StageBytes(input=1, activations=4, wcut=1000)
    self.assertEqual(_Profile('1f1b', stage=big).step_peak, (10, 5))

  def testFusedLastStageHoldsWhatItsForwardAndBackwardHeld(self):
    # ticks.FuseLast's FB holds a kept forward while it runs, as its F and
    # the backward that directly followed it did; a split FB leaves wcut.
    for name in ('gpipe', '1f1b', 'zb_h1'):
      sched = schedule_lib.Make(name, 2, 4)
      fused = ticks.FuseLast(sched)
      with self.subTest(name=name):
        self.assertEqual(
            memory.Profile(fused, [_STAGE] * 2,
                           memory.KeptForwards(sched, 'never')).step_peak,
            _Profile(name).step_peak)

  def testWeightsAndGradientSumsOfEveryStageOfADevice(self):
    stage = memory.StageBytes(input=1, activations=4, weights=100,
                              gradients=10)
    # Interleaved V = 2: device 0 holds stages 0 and 2.
    prof = _Profile('interleaved_1f1b', v=2, stage=stage)
    self.assertEqual(prof.weights, (200, 200))
    self.assertEqual(prof.peak, tuple(200 + p for p in prof.step_peak))
    # No sums at the start (F(0, 0)'s 5 alone); both stages' sums at the end.
    self.assertEqual(prof.held[0], (5, 0))
    self.assertEqual(prof.held[-1], (20, 20))

  def testTheSumsStartWithTheFirstWeightGradients(self):
    # The engine's sums are the first piece's gradients, added to after:
    # GPipe K = 2, M = 2 (unit times), dev 1 during BW1 (t = 3-5) holds F0,
    # F1 (10) and BW1's gradients (10), no sums yet; from BW1's end on the
    # sums (10), and during BW0 its gradients beside them.
    stage = memory.StageBytes(input=1, activations=4, gradients=10)
    prof = _Profile('gpipe', m=2, stage=stage)
    held = dict(zip(prof.times, prof.held))
    self.assertEqual(held[3.0], (10, 20))
    self.assertEqual(held[5.0], (20, 25))  # F0 and BW0's 10 beside the sums.
    self.assertEqual(prof.step_peak, (25, 25))

  def testABackwardHoldsItsWeightGradientsBesideTheSums(self):
    # A piece's weight gradients are added to the sums when it returns:
    # while a BW (or a W) runs, its device holds them beside the sums.
    stage = memory.StageBytes(input=1, activations=4, gradients=10)
    # 1F1B: dev 0 during BW0 holds F0 and F1 (10), the sums and BW0's
    # gradients (20); dev 1 during its BW, one micro-batch (5) and 20.
    self.assertEqual(_Profile('1f1b', stage=stage).step_peak, (30, 25))
    # ZB-H1: a B makes no weight gradient, its W does: dev 0 during B0
    # holds F0, F1 and the sums (20); during W0 (right after B0) F1, the
    # sums and W0's gradients (25).
    self.assertEqual(_Profile('zb_h1', stage=stage).step_peak, (25, 20))

  def testTheSimulatedTimesSayWhen(self):
    sched = schedule_lib.Make('gpipe', 2, 2)
    stages = [memory.StageBytes(input=1, activations=4)] * 2
    kept = memory.KeptForwards(sched, 'never')
    # Unit times: dev 1 starts F1 at t = 2, when dev 0 holds both: 10 + 10.
    unit = memory.Profile(sched, stages, kept)
    self.assertEqual((unit.total_step_peak, unit.worst_time), (20, 2))
    # Forwards of 3: dev 1 starts F1 at t = 6.
    slow = schedule_lib.Simulate(sched, forward_time=3)
    prof = memory.Profile(sched, stages, kept, slow)
    self.assertEqual((prof.total_step_peak, prof.worst_time), (20, 6))


class StageBytesTest(absltest.TestCase):

  def testFromLayerSizes(self):
    # Input 3, layers' outputs 5 and 7 per example, 4 examples.
    st = memory.StageBytesOf(3, [5, 7], num_params=10, micro_batch_size=4,
                             bytes_per_param=12)
    self.assertEqual(st.input, 12)
    self.assertEqual(st.activations, 48)
    # Layer inputs 3 + 5, output gradients 5 + 7.
    self.assertEqual(st.wcut, 80)
    self.assertEqual((st.weights, st.gradients), (120, 40))

  def testTracedSizesReplaceTheOutputsLayerByLayer(self):
    # layer_bytes.py's sizes where known; the first layer's are not.
    st = memory.StageBytesOf(3, [5, 7], num_params=10, micro_batch_size=4,
                             kept_bytes=[None, 70], wcut_bytes=[None, 90])
    self.assertEqual(st.activations, 4 * (5 + 70))
    self.assertEqual(st.wcut, 4 * ((3 + 5) + 90))


class KeptForwardsTest(absltest.TestCase):

  def testPolicies(self):
    sched = schedule_lib.Make('1f1b', 2, 4)
    every = {(s, m) for s in range(2) for m in range(4)}
    self.assertEqual(memory.KeptForwards(sched, 'never'), every)
    self.assertEqual(memory.KeptForwards(sched, 'always'),
                     sched.ForwardsFollowedByBackward())
    self.assertEqual(memory.KeptForwards(sched, 'except_last'),
                     sched.ForwardsFollowedByBackward() | {(0, 3), (1, 3)})

  def testBadInputIsANamedError(self):
    sched = schedule_lib.Make('gpipe', 2, 2)
    with self.assertRaisesRegex(schedule_lib.ScheduleError, 'remat'):
      memory.KeptForwards(sched, 'sometimes')
    with self.assertRaisesRegex(schedule_lib.ScheduleError, '2 stages'):
      memory.Profile(sched, [_STAGE], set())


if __name__ == '__main__':
  absltest.main()
