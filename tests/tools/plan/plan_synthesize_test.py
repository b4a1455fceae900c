"""tools/plan/synthesize.py and tools.plan --synthesize / --synthesize_table: a model's schedule written and drawn, the table on paper."""

import os
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest

from gpipe_tf.pipeline import layer_bytes
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
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


class TransformerBlockTest(absltest.TestCase):

  def testBytesComeFromTheTrace(self):
    with mock.patch.object(layer_bytes, 'KeptBytes',
                           return_value=[(1000, 3000)]) as traced:
      block = plan_synthesize.TransformerBlock()
    (params, shapes), _ = traced.call_args
    self.assertLen(params, 1)
    self.assertEqual([tuple(s) for s in shapes], [(None, 32, 256), (None, 32)])
    b = plan_synthesize.TRANSFORMER_MICRO_BATCH
    # Input: 32 x 256 values and a mask of 32, float32, per sequence.
    self.assertEqual(block.bytes, memory.StageBytes(
        input=(32 * 256 + 32) * 4 * b, activations=1000 * b, wcut=3000 * b))
    self.assertEqual((block.forward, block.backward, block.weight),
                     plan_synthesize.TRANSFORMER_TIMES)

  def testAnUntraceableBlockIsAPlanError(self):
    with mock.patch.object(layer_bytes, 'KeptBytes', return_value=[None]):
      with self.assertRaisesRegex(plan_lib.PlanError, 'could not be traced'):
        plan_synthesize.TransformerBlock()

  def testTheRealTraceKeepsMoreThanTheBlocksOutput(self):
    block = plan_synthesize.TransformerBlock()
    # Attention probabilities and the 4d-wide hidden layer: far over the
    # block's input (which its output's size equals); W reads more still.
    self.assertGreater(block.bytes.activations, 10 * block.bytes.input)
    self.assertGreater(block.bytes.wcut, block.bytes.activations)


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

  def testTable(self):
    text = self._Run('--synthesize_table', '--table_devices=2',
                     '--table_micro_batches=8', '--table_budgets=1')
    self.assertIn('| 2 | 8 | 1 |', text)
    self.assertIn("At 1F1B's peak", text)


if __name__ == '__main__':
  absltest.main()
