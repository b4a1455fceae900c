"""tools/plan/synthesize.py and tools.plan --synthesize / --synthesize_table: a model's schedule written and drawn, the table on paper."""

import os
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import controllable
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import synthesize
from tools.plan import lib as plan_lib
from tools.plan import synthesize as plan_synthesize

_LAYER = plan_lib.LayerCost(flops=1e6, num_params=1000, output_bytes=4096)
_MODEL = plan_lib.Model(layers=(_LAYER,) * 8, input_bytes=2048,
                        bytes_per_param=12)


class LayerCostsTest(absltest.TestCase):

  def testTimesAndBytesPerMicroBatch(self):
    costs = plan_synthesize.LayerCosts(_MODEL, 8, flops_per_second=1e9)
    self.assertLen(costs, 8)
    self.assertAlmostEqual(costs[0].forward, 8e-3)  # 1 MFLOP x 8 at 1 GFLOP/s.
    self.assertEqual((costs[0].backward, costs[0].weight),
                     (costs[0].forward,) * 2)
    self.assertEqual(costs[0].bytes, memory.StageBytes(
        input=2048 * 8, activations=4096 * 8, wcut=(2048 + 4096) * 8,
        weights=12000, gradients=4000))
    self.assertEqual(costs[1].bytes.input, 4096 * 8)


class TableTest(absltest.TestCase):

  def testSynthesizedAgainstTheLibrary(self):
    layer = layout.LayerCost(1.0, 1.0, 1.0, memory.StageBytes(
        input=1, activations=4, wcut=4))
    rows = plan_synthesize.Table(layer, 8, 0.0, (2,), (4, 8), (0.5, 1.0))
    self.assertLen(rows, 4)
    for r in rows:
      with self.subTest(m=r.num_micro_batches, f=r.budget_fraction):
        self.assertIsNotNone(r.synthesized)
        self.assertLessEqual(r.synthesized[2], r.budget * (1 + 1e-9))
        if r.library is not None:
          self.assertLessEqual(r.synthesized[1], r.library[1] * (1 + 1e-9))
    at_peak = [r for r in rows if r.budget_fraction == 1.0]
    # 1F1B fits its own peak, so a library schedule always does there.
    self.assertTrue(all(r.library is not None for r in at_peak))
    text = plan_synthesize.FormatTable(rows)
    self.assertIn('| 2 | 8 | 1 |', text)
    self.assertLen(text.splitlines(), 2 + 4)
    targets = plan_synthesize.Targets(rows)
    self.assertIn('2 of 2 rows', targets[0])
    self.assertIn('of 1 rows', targets[1])  # M = 8 >= 4K only.

  def testVHalfOnTheVShapedSplit(self):
    layer = layout.LayerCost(1.0, 1.0, 1.0, memory.StageBytes(
        input=1, activations=4, wcut=4))
    row, = plan_synthesize.Table(layer, 8, 0.0, (2,), (8,), (0.5,))
    # V-Half on 4 stages of 2 layers, fitting 0.5x or not.
    half = synthesize.Evaluate(
        layout.StageProblem([layer] * 8, [2] * 4, 2, 8),
        controllable.VHalf(2, 8))
    self.assertEqual(row.v_half, (half.makespan, max(half.peaks)))
    self.assertIn(f'| 2 | 8 | 0.5 | {half.makespan / row.one_f_one_b[0]:.3f}, '
                  f'{max(half.peaks) / row.one_f_one_b[1]:.3f} |',
                  plan_synthesize.FormatTable([row]))
    # 6 layers on K = 2: no V = 2 split of 4 stages, so no V-Half.
    row, = plan_synthesize.Table(layer, 6, 0.0, (2,), (8,), (0.5,))
    self.assertIsNone(row.v_half)
    self.assertIn('| 2 | 8 | 0.5 | - |', plan_synthesize.FormatTable([row]))


class PlanSynthesizeToolTest(absltest.TestCase):

  def _Run(self, *args):
    from tools.plan import main as plan  # pylint: disable=g-import-not-at-top
    flag_values = flags.FlagValues()
    plan.DefineFlags(flag_values)
    flag_values(['plan'] + list(args))
    return plan.Run(flag_values)

  def testWritesTorchCsvAndPngOfTheModelsSchedule(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'tiny.csv')
      text = self._Run('--model=synthetic.mlp.TinyPipelined', '--devices=2',
                       '--activations=outputs', f'--synthesize={path}',
                       '--micro_batches=4')
      self.assertIn('M=4 micro-batches', text)
      self.assertIn('Synthesized:', text)
      self.assertIn('dev 1:', text)  # The unit-time grid.
      loaded = schedule_lib.Load(path)
      self.assertEqual((loaded.num_devices, loaded.num_micro_batches), (2, 4))
      self.assertGreater(os.path.getsize(os.path.join(tmp, 'tiny.png')), 0)

  def testTooSmallABudgetIsAPlanError(self):
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(plan_lib.PlanError, 'at least'):
        self._Run('--model=synthetic.mlp.TinyPipelined', '--devices=2',
                  '--activations=outputs', '--memory_budget_mib=0.001',
                  f'--synthesize={os.path.join(tmp, "x.csv")}')

  def _Table(self, *block_flags):
    """--synthesize_table at K=2, M=8 and 1F1B's peak, for the block the
    flags give."""
    return self._Run('--synthesize_table', '--table_devices=2',
                     '--table_micro_batches=8', '--table_budgets=1',
                     *block_flags)

  def testTable(self):
    text = self._Table()
    self.assertIn('| 2 | 8 | 1 |', text)
    self.assertIn("At 1F1B's peak", text)
    self.assertIn('d=256, T=32, h=4, H=1024', text)
    self.assertIn('measured on the benchmark block', text)

  def testTableOfAChosenBlock(self):
    tiny = ('--table_width=8', '--table_tokens=4', '--table_heads=2',
            '--table_micro_batch=2')
    for hidden, named in [((), 'H=32'), (('--table_hidden=12',), 'H=12')]:
      with self.subTest(hidden=named):  # Default: 4 x --table_width.
        text = self._Table(*tiny, *hidden)
        self.assertIn(f'd=8, T=4, h=2, {named}, float32, micro-batches of 2',
                      text)
        # Per sequence: 4 tokens x 8 values and a mask of 4, float32.
        self.assertIn('input 144,', text)
        self.assertIn('scaled by FLOPs', text)
        self.assertIn('| 2 | 8 | 1 |', text)

  def testDevicesThatCannotSplitTheLayersAreAPlanError(self):
    with self.assertRaisesRegex(plan_lib.PlanError, '--table_devices'):
      self._Table('--table_devices=3')

  def testBadTableBlockIsAPlanError(self):
    with self.assertRaisesRegex(plan_lib.PlanError, '--table_heads'):
      self._Run('--synthesize_table', '--table_width=10', '--table_heads=4')


if __name__ == '__main__':
  absltest.main()
