"""tools/plan/main.py, lib.py and check.py: layouts estimated from FLOPs and the simulator, ranked within a budget, checked against rows."""

import dataclasses
import json
import os
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest

from gpipe_tf.pipeline.schedule import memory
from tools.plan import check as plan_check
from tools.plan import lib as plan_lib
from gpipe_tf.pipeline import layer_bytes

# 8 equal layers of 1 MFLOP, 1000 parameters and 4 KiB of output per example.
_LAYER = plan_lib.LayerCost(flops=1e6, num_params=1000, output_bytes=4096)
_MODEL = plan_lib.Model(layers=(_LAYER,) * 8, input_bytes=4096,
                        bytes_per_param=12)  # Adam: weight 4 + slots 8.
_MIB = plan_lib.MIB


def _Layout(k=2, m=8, schedule='gpipe', remat='never', r=1, v=1):
  return plan_lib.Layout(k, r, m, schedule, v, remat)


class CandidatesTest(absltest.TestCase):

  def testGrid(self):
    layouts = plan_lib.Candidates(4, 64, num_layers=8, max_micro_batches=8)
    self.assertEqual({(lo.num_partitions, lo.num_replicas) for lo in layouts},
                     {(1, 4), (2, 2), (4, 1)})
    self.assertEqual({lo.num_micro_batches for lo in layouts}, {1, 2, 4, 8})
    self.assertEqual({(lo.schedule, lo.num_virtual_stages) for lo in layouts},
                     {('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2),
                      ('zb_h1', 1), ('zbv', 2), ('dualpipe_v', 2)})
    # DualPipeV needs M >= 2K.
    self.assertTrue(all(lo.num_micro_batches >= 2 * lo.num_partitions
                        for lo in layouts if lo.schedule == 'dualpipe_v'))
    self.assertEqual({lo.remat for lo in layouts}, {'never', 'always'})

  def testLimits(self):
    # R = 4 replicas do not divide a batch of 6; M stops at the replica's batch;
    # K x V stages need as many layers.
    layouts = plan_lib.Candidates(4, 6, num_layers=3)
    self.assertEqual({lo.num_partitions for lo in layouts}, {2})
    self.assertEqual({lo.num_micro_batches for lo in layouts}, {1, 2})
    self.assertNotIn('interleaved_1f1b', {lo.schedule for lo in layouts})
    with self.assertRaisesRegex(plan_lib.PlanError, "'pipedream'|pipedream"):
      plan_lib.Candidates(2, 8, 8, schedules=['pipedream'])


class EvaluateTest(absltest.TestCase):

  def testGPipeTimeBubbleAndMemory(self):
    plan = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4), batch_size=32,
                             flops_per_second=1e9)
    # 4 layers x 1 MFLOP x 8 examples per micro-batch at 1 GFLOP/s: F = 32 ms,
    # BW = 64 ms; fill-drain takes 3 F (M + K - 1).
    self.assertEqual(plan.balance, (4, 4))
    self.assertAlmostEqual(plan.makespan, 3 * 0.032 * 5)
    self.assertAlmostEqual(plan.bubble_fraction, 1 / 5)
    self.assertAlmostEqual(plan.examples_per_sec, 32 / plan.makespan)
    self.assertEqual(plan.peak_in_flight, (4, 4))
    self.assertEqual(plan.static_bytes, (4000 * 12,) * 2)
    # 4 micro-batches x 8 examples x (input + 4 outputs) and the first
    # backward's weight gradients; no sums yet (they start as those).
    self.assertEqual(plan.step_bytes, (4000 * 4 + 4 * 8 * 5 * 4096,) * 2)

  def testGivenStageBytesReplaceTheEstimate(self):
    # Sizes read from a traced step (gpipe_tf/pipeline/introspect.py): GPipe at
    # M = 4 holds 4 micro-batches of each stage's input + activations and
    # its first backward's gradients (no sums before them); device 1's
    # first backward runs while device 0 still holds all 4.
    stage = memory.StageBytes(input=10, activations=100, gradients=7)
    plan = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4), 32,
                             stage_bytes=[stage, stage])
    self.assertEqual(plan.step_bytes, (7 + 4 * 110,) * 2)
    # All 8 micro-batches and device 1's first gradients, no sums yet.
    self.assertEqual(plan.total_step_bytes, 7 + 2 * 4 * 110)
    with self.assertRaisesRegex(plan_lib.PlanError, 'one StageBytes per '
                                'stage.*2 stages, got 1'):
      plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4), 32, stage_bytes=[stage])

  def testRematKeepsBoundaryInputsAndCostsAForward(self):
    never = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4), 32)
    always = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4, remat='always'), 32)
    # 4 inputs + one stage's 4 outputs, of 8 examples each: micro-batches 0-2
    # while BW(0, 2) recomputes, or all 4 inputs and the kept micro-batch 3
    # (its BW directly follows its F) until BW(0, 3), and that first
    # backward's gradients (no sums before them).
    self.assertEqual(always.step_bytes[0],
                     4000 * 4 + (4 + 4) * 8 * 4096)
    # 3 of 4 micro-batches recomputed: BW = 2F + 3/4 F on both stages, and
    # fill-drain takes (M + K - 1)(F + BW): 3.75 F against 3 F per slot.
    self.assertAlmostEqual(always.makespan / never.makespan, 3.75 / 3)

  def testAlwaysKeepsForwardsWhoseBackwardFollows(self):
    # 1F1B, K = 2, M = 4: stage 1 runs F(1, m) BW(1, m) back to back and
    # recomputes nothing (work 3 F per layer), stage 0 recomputes all (4 F),
    # so the weighted partition gives stage 1 more layers: (3, 5).
    never = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=4, schedule='1f1b'), 32)
    always = plan_lib.Evaluate(
        _MODEL, _Layout(k=2, m=4, schedule='1f1b', remat='always'), 32)
    self.assertEqual(never.balance, (4, 4))
    self.assertEqual(always.balance, (3, 5))
    # In units of a 4-layer forward: stage 0 F = 0.75, BW = 2.25; stage 1
    # F = 1.25, BW = 2.5. Device 1 runs F0 [0.75, 2) BW0 [2, 4.5) F1 BW1 F2
    # BW2 F3 [12, 13.25) BW3 [13.25, 15.75); device 0's BW(0, 3) then runs
    # [15.75, 18): 18 against 15 without remat (the same as with (4, 4)).
    self.assertAlmostEqual(always.makespan / never.makespan, 18 / 15)
    # Stage 0 (3 layers): gradient sums + two inputs and one recompute of 3
    # outputs; stage 1 (5 layers): sums + one micro-batch whole; both while
    # a backward runs, with its own gradients.
    self.assertEqual(always.step_bytes,
                     (2 * 3000 * 4 + (2 + 3) * 8 * 4096,
                      2 * 5000 * 4 + (1 + 5) * 8 * 4096))
    # With M = 1 every backward follows its forward: 'always' is 'never'.
    for name in ('gpipe', '1f1b'):
      never = plan_lib.Evaluate(_MODEL, _Layout(k=2, m=1, schedule=name), 32)
      always = plan_lib.Evaluate(
          _MODEL, _Layout(k=2, m=1, schedule=name, remat='always'), 32)
      self.assertEqual(
          (always.makespan, always.step_bytes, always.total_step_bytes),
          (never.makespan, never.step_bytes, never.total_step_bytes), name)

  def testAllDevicesAtOnceHoldLessThanTheSumOfTheirPeaks(self):
    # 1F1B, K = 4, M = 2, F = 1 per stage of 2 layers: stages 0-2 recompute
    # (BW = 3) one after the other, BW(2, 0) at [6, 9), BW(1, 0) at [9, 12),
    # BW(0, 0) at [12, 15); stage 3 keeps both micro-batches, F(3, 0) BW(3, 0)
    # at [3, 6) and F(3, 1) BW(3, 1) at [6, 9).
    plan = plan_lib.Evaluate(_MODEL, _Layout(k=4, m=2, schedule='1f1b',
                                             remat='always'), 32)
    unit = 16 * 4096  # One example-layer output of the 16-example batch.
    # Stages 0-2: 2 inputs + a recompute of 2 outputs while their first
    # backward runs (its gradients, no sums yet); stage 3: one whole while
    # its second runs (the sums and its own gradients).
    self.assertEqual(plan.step_bytes, (2000 * 4 + 4 * unit,) * 3 +
                     (2 * 2000 * 4 + 3 * unit,))
    # At [7, 9): devices 0 and 1 hold 2 inputs each, device 2 recomputes
    # (4), device 3 holds micro-batch 1 whole (3): 11 units, not 4 + 4 + 4 +
    # 3; devices 2 and 3 each run a backward (its gradients), and only
    # device 3 has made gradients before, so only its sums exist.
    self.assertEqual(plan.total_step_bytes, (1 + 2) * 2000 * 4 + 11 * unit)

  def testMoreMicroBatchesLowerTheBubble(self):
    bubbles = [plan_lib.Evaluate(_MODEL, _Layout(k=4, m=m), 64).bubble_fraction
               for m in (1, 2, 4, 8, 16)]
    self.assertEqual(bubbles, sorted(bubbles, reverse=True))
    self.assertAlmostEqual(bubbles[0], 3 / 4)

  def testOneFOneBHoldsLessThanGPipe(self):
    gpipe = plan_lib.Evaluate(_MODEL, _Layout(k=4, m=16), 64)
    one = plan_lib.Evaluate(_MODEL, _Layout(k=4, m=16, schedule='1f1b'), 64)
    self.assertEqual(one.peak_in_flight, (4, 3, 2, 1))
    self.assertLess(one.memory_bytes, gpipe.memory_bytes)
    self.assertAlmostEqual(one.makespan, gpipe.makespan)

  def testReplicasSplitTheBatch(self):
    plan = plan_lib.Evaluate(_MODEL, _Layout(k=1, m=1, r=4), 64)
    self.assertEqual(plan.peak_in_flight, (1,))
    self.assertEqual(plan.static_bytes, (8000 * 12,))  # The whole model.
    alone = plan_lib.Evaluate(_MODEL, _Layout(k=1, m=1), 16)
    self.assertAlmostEqual(plan.examples_per_sec, 4 * alone.examples_per_sec)


  def testWithKeptBytesReplacesTheEstimatesGiven(self):
    from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
    fc = plan_lib.ModelOf([layers.FCLayer.Params().Set(
        name='fc', input_dim=8, output_dim=8)], [(None, 8)], 4)
    traced = plan_lib.WithKeptBytes(fc, [(100, 200)])
    self.assertEqual((traced.layers[0].kept_bytes,
                      traced.layers[0].wcut_bytes), (100, 200))
    self.assertEqual(plan_lib.WithKeptBytes(fc, [None]), fc)
    with self.assertRaisesRegex(plan_lib.PlanError, '1 layers, got 2'):
      plan_lib.WithKeptBytes(fc, [None, None])


class RankTest(absltest.TestCase):

  def testTinyBudgetPicksRematOrOneFOneBOverGPipeNever(self):
    # 16 MB of weights, slots and gradients per layer: one device cannot hold
    # all 8 layers within the budgets below, so K = 2.
    big = plan_lib.Model((dataclasses.replace(_LAYER, num_params=10**6),) * 8,
                         _MODEL.input_bytes, _MODEL.bytes_per_param)
    plans = plan_lib.Rank(big, 2, 64, schedules=['gpipe', '1f1b'])
    gpipe_never = [p for p in plans if (p.layout.schedule, p.layout.remat,
                                        p.layout.num_partitions) ==
                   ('gpipe', 'never', 2)]
    # GPipe at M <= K is 1F1B; from M = 8 on it holds the most.
    budget = min(p.memory_bytes for p in gpipe_never
                 if p.layout.num_micro_batches >= 8) - 1
    plans = plan_lib.Rank(big, 2, 64, budget, schedules=['gpipe', '1f1b'])
    best = plan_lib.Best(plans)
    self.assertEqual(best.layout.num_partitions, 2)
    self.assertTrue(best.layout.remat == 'always' or
                    best.layout.schedule == '1f1b', best.layout)
    self.assertLessEqual(best.memory_bytes, budget)
    excluded = {p.layout for p in gpipe_never if p.memory_bytes > budget}
    self.assertTrue(excluded)
    self.assertFalse(any(p.fits for p in plans if p.layout in excluded))
    self.assertIn('Memory decided it: without the budget K=1 R=2',
                  plan_lib.Reason(plans, budget))

  def testHugeBudgetOnOneDeviceIsOneCell(self):
    plans = plan_lib.Rank(_MODEL, 1, 64, memory_budget_bytes=2**40)
    best = plan_lib.Best(plans)
    self.assertEqual((best.layout.num_partitions, best.layout.num_replicas),
                     (1, 1))
    self.assertEqual(best.layout.remat, 'never')

  def testZeroBubbleWinsAtEqualKAndMWhenMemoryIsNotBinding(self):
    plans = plan_lib.Rank(_MODEL, 4, 64, schedules=['gpipe', '1f1b', 'zb_h1'],
                          max_micro_batches=8)
    same = [p for p in plans if (p.layout.num_partitions,
                                 p.layout.num_micro_batches) == (4, 8)]
    self.assertEqual(same[0].layout.schedule, 'zb_h1')
    self.assertLess(same[0].bubble_fraction, same[-1].bubble_fraction)

  def testNothingFitsIsANamedError(self):
    plans = plan_lib.Rank(_MODEL, 2, 64, memory_budget_bytes=1000)
    with self.assertRaisesRegex(plan_lib.PlanError,
                                'smallest, K=2 R=1 .* needs .* MiB'):
      plan_lib.Best(plans)

  def testTable(self):
    plans = plan_lib.Rank(_MODEL, 2, 64, schedules=['1f1b'], remats=['never'])
    table = plan_lib.FormatTable(plans, top=3)
    self.assertLen(table.splitlines(), 2 + 3)
    # Two replicas of one cell have no bubble; at equal speed, the fewest
    # micro-batches come first, then the least memory.
    self.assertIn('| 1 | 1 | 2 | 1 | 1f1b | 1 | never | ', table)
    self.assertIn('| 2 | 1 | 2 | 2 | 1f1b | 1 | never | ', table)


class CompareTest(absltest.TestCase):

  def testEstimatesBesideMeasuredRows(self):
    rows = [dict(pipeline=True, mode='train', num_replicas=1, single_core=False,
                 num_partitions=k, num_micro_batches=m, remat=remat,
                 schedule='gpipe', num_virtual_stages=1,
                 examples_per_sec=eps, peak_memory_bytes=mib * _MIB)
            for k, m, remat, eps, mib in ((2, 1, 'never', 100, 10),
                                          (2, 4, 'never', 150, 10),
                                          (2, 4, 'always', 120, 3),
                                          (2, 4, 'except_last', 1, 1))]
    text = plan_check.Compare(_MODEL, rows, 64)
    self.assertIn('| K=2 M=4 gpipe remat=never | 150 | 1.50 | 1.60 | 1 | 1 |',
                  text)
    self.assertNotIn('except_last', text)
    self.assertIn('throughput 1.00, memory 1.00 (3 rows)', text)
    self.assertIn('peak MiB measured (all devices) | step MiB planner (all '
                  'devices) |', text)

  def testProcessesRowsCompareTheFullestDevice(self):
    # Rows of --devices=processes hold each worker's own peak: the fullest
    # device's is set beside the fullest device's estimate.
    rows = [dict(pipeline=True, mode='train', num_replicas=1,
                 single_core=False, num_partitions=2, num_micro_batches=m,
                 remat='never', schedule=name, num_virtual_stages=1,
                 examples_per_sec=100, peak_memory_bytes=9 * _MIB,
                 device_peak_memory_bytes=[peak * _MIB, 1 * _MIB])
            for name, m, peak in (('gpipe', 4, 5), ('1f1b', 4, 3))]
    text = plan_check.Compare(_MODEL, rows, 64)
    self.assertIn('peak MiB measured (fullest device) | step MiB planner '
                  '(fullest device) |', text)
    for row in rows:
      plan = plan_lib.Evaluate(_MODEL, plan_lib.Layout(
          2, 1, 4, row['schedule'], 1, 'never'), 64)
      self.assertIn(f"| {max(row['device_peak_memory_bytes']) / _MIB:.1f} | "
                    f'{max(plan.step_bytes) / _MIB:.1f} |', text)
    # GPipe holds all M activations, 1F1B at most K: the ranks agree.
    self.assertIn('memory 1.00 (2 rows)', text)


class CalibrateTest(absltest.TestCase):

  def _Rows(self, speed, pass_seconds):
    """Rows whose workers worked what the model with `speed` and
    `pass_seconds` says, each device its stages' FLOPs and passes."""
    rows = []
    for name, m, v, remat in (('gpipe', 2, 1, 'never'), ('1f1b', 8, 1, 'never'),
                              ('interleaved_1f1b', 4, 2, 'never'),
                              ('gpipe', 4, 1, 'always')):
      b = 64 // m
      share = 0.0 if remat == 'never' else 0.75  # GPipe, K=2, M=4.
      layers = 8 // (2 * v)  # Equal stages of 1 MFLOP layers.
      busy = v * m * (layers * 1e6 * b * (3 + share) / speed +
                      2 * layers * pass_seconds)
      rows.append(dict(pipeline=True, mode='train', num_replicas=1,
                       single_core=False, num_partitions=2,
                       num_micro_batches=m, remat=remat, schedule=name,
                       num_virtual_stages=v, examples_per_sec=100.0,
                       peak_memory_bytes=_MIB,
                       device_busy_seconds_per_step=[busy, busy]))
    return rows

  def testRecoversTheSpeedAndThePassCost(self):
    speed, pass_seconds = plan_check.Calibrate(
        _MODEL, self._Rows(5e10, 2e-4), 64)
    self.assertAlmostEqual(speed / 5e10, 1.0, places=6)
    self.assertAlmostEqual(pass_seconds / 2e-4, 1.0, places=6)
    with self.assertRaisesRegex(plan_lib.PlanError, 'devices=processes'):
      plan_check.Calibrate(_MODEL, [], 64)

  def testAPassCostMakesMoreMicroBatchesCostMore(self):
    def _Rate(m, pass_seconds):
      return plan_lib.Evaluate(_MODEL, _Layout(k=2, m=m, schedule='1f1b'),
                               64, 5e10, pass_seconds).examples_per_sec
    # Without it, more micro-batches only shrink the bubble.
    self.assertGreater(_Rate(32, 0.0), _Rate(4, 0.0))
    # With it, 32 micro-batches pay 8x the passes of 4.
    self.assertLess(_Rate(32, 2e-4), _Rate(4, 2e-4))
    self.assertLess(_Rate(4, 2e-4), _Rate(4, 0.0))

  def testCompareCalibratesOnProcessesRows(self):
    text = plan_check.Compare(_MODEL, self._Rows(5e10, 2e-4), 64)
    self.assertIn('calibrated on the rows\' worker CPU time: 50.0 GFLOP/s '
                  'and 200 us per layer per pass', text)


class PlanToolTest(absltest.TestCase):
  """The entry point on a registered experiment (FPropMeta, no devices)."""

  def _Run(self, *args):
    from tools.plan import main as plan  # pylint: disable=g-import-not-at-top
    flag_values = flags.FlagValues()
    plan.DefineFlags(flag_values)
    flag_values(['plan'] + list(args))
    return plan.Run(flag_values)

  def testJsonOfTinyMlp(self):
    out = json.loads(self._Run('--model=synthetic.mlp.TinyPipelined',
                               '--devices=2', '--json', '--top=3'))
    self.assertEqual((out['devices'], out['batch_size']), (2, 32))
    self.assertEqual((out['activations'], out['precision']),
                     ('traced', 'float32'))  # The defaults.
    self.assertLen(out['plans'], 3)
    self.assertIn('Recommended', out['reason'])
    first = out['plans'][0]
    self.assertEqual(first['num_partitions'] * first['num_replicas'], 2)
    # Tiny's optimizer is Adam: 4 + 8 bytes of weight and slots, 4 of gradient.
    params = 16 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    self.assertEqual(sum(first['static_bytes']), 12 * params)  # One replica.

  def testTracedActivationsNameTheLayersTheTraceCouldNotBuild(self):
    # Tiny's FC layers trace; with outputs nothing is said. A layer the
    # trace cannot build is named, not silently estimated.
    traced = self._Run('--model=synthetic.mlp.TinyPipelined', '--devices=2',
                       '--top=1', '--activations=traced')
    self.assertNotIn('keep the estimate', traced)
    with mock.patch.object(layer_bytes, '_Trace', return_value=None):
      failed = self._Run('--model=synthetic.mlp.TinyPipelined', '--devices=2',
                         '--top=1', '--activations=traced')
    self.assertRegex(failed, r'--activations=traced: layers 0, 1, .* keep '
                     'the estimate from their outputs')

  def testPrecisionPutsActivationsIn16Bits(self):
    from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
    from gpipe_tf.layers import precision  # pylint: disable=g-import-not-at-top
    from tools.plan import main as plan  # pylint: disable=g-import-not-at-top
    self.assertEqual(plan._POLICIES, tuple(precision.POLICIES))
    params = model_registry.GetParams('synthetic.mlp.TinyPipelined')
    full, _, _ = plan.ExperimentModel(params, 'outputs')
    half, _, _ = plan.ExperimentModel(params, 'outputs', 'mixed_bfloat16')
    self.assertEqual([c.output_bytes for c in half.layers],
                     [c.output_bytes // 2 for c in full.layers])
    self.assertEqual(half.input_bytes * 2, full.input_bytes)
    # Variables, their slots and gradients stay float32.
    self.assertEqual((half.bytes_per_param, half.grad_bytes_per_param),
                     (full.bytes_per_param, full.grad_bytes_per_param))
    traced, _, _ = plan.ExperimentModel(params, 'traced', 'mixed_bfloat16')
    self.assertEqual(traced.layers[0].kept_bytes * 2,
                     plan.ExperimentModel(params)[0].layers[0].kept_bytes)
    out = self._Run('--model=synthetic.mlp.TinyPipelined', '--devices=2',
                    '--top=1', '--precision=mixed_bfloat16')
    self.assertIn('precision mixed_bfloat16;', out)

  def testCompareTakesTheRowsOfOnePolicy(self):
    rows = [dict(pipeline=True, mode='train', num_replicas=1,
                 single_core=False, num_partitions=2, num_micro_batches=2,
                 remat='never', schedule=s, num_virtual_stages=1,
                 examples_per_sec=50.0, peak_memory_bytes=2**20, dtype=d)
            for s, d in (('1f1b', 'float32'), ('gpipe', 'mixed_bfloat16'))]
    path = os.path.join(tempfile.mkdtemp(), 'rows.json')
    with open(path, 'w') as f:
      json.dump(dict(block='fc', num_blocks=4, dim=8, seq_len=4,
                     batch_size=16, learning_rate=0.1, num_devices=2,
                     devices='shared', rows=rows), f)
    with self.assertRaisesRegex(plan_lib.PlanError, 'several precision '
                                'policies.*pass --precision'):
      self._Run(f'--compare={path}')
    out = self._Run(f'--compare={path}', '--precision=mixed_bfloat16')
    self.assertIn('K=2 M=2 gpipe remat=never', out)
    self.assertNotIn('K=2 M=2 1f1b remat=never |', out)
    with self.assertRaisesRegex(plan_lib.PlanError, 'no row .* timed under '
                                '--precision=mixed_float16'):
      self._Run(f'--compare={path}', '--precision=mixed_float16')

  def testCompareReadsTheBenchmarksModelAndRows(self):
    row = dict(pipeline=True, mode='train', num_replicas=1, single_core=False,
               num_partitions=2, num_micro_batches=2, remat='never',
               schedule='1f1b', num_virtual_stages=1, examples_per_sec=50.0,
               peak_memory_bytes=2**20)
    path = os.path.join(tempfile.mkdtemp(), 'rows.json')
    with open(path, 'w') as f:
      json.dump(dict(block='fc', num_blocks=4, dim=8, seq_len=4,
                     batch_size=16, learning_rate=0.1, num_devices=2,
                     devices='processes', rows=[row]), f)
    out = self._Run(f'--compare={path}', '--top=2')
    self.assertIn('(--devices=processes: one worker process per device)', out)
    self.assertIn("tools.benchmark's 4 x fc blocks of width 8: D=2 devices, "
                  'batch 16', out)
    self.assertIn('| K=2 M=2 1f1b remat=never | 50 | 1.00 | 1.00 | 1 | 1 | '
                  '1.0 |', out)


if __name__ == '__main__':
  absltest.main()
