"""Tests of tools/plan/model_stats.py: counts of registered models without building them."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import json  # pylint: disable=g-import-not-at-top,g-bad-import-order
import subprocess
import sys
import time

from absl import flags
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.layers import core
from gpipe_tf.pipeline import partition
from tools.plan import model_stats

_ROOT = test_utils.REPO_ROOT
_L1663 = 'lm.synthetic.TransformerL_1663'


def _Run(*args):
  """model_stats.Run on fresh flags parsed from `args`."""
  flag_values = flags.FlagValues()
  model_stats.DefineFlags(flag_values)
  flag_values(['model_stats'] + list(args))
  return model_stats.Run(flag_values)


class ModelStatsTest(tf.test.TestCase):

  def testTransformerL1663InSeconds(self):
    start = time.time()
    stats = json.loads(_Run(f'--model={_L1663}', '--json'))
    self.assertLess(time.time() - start, 30.0)
    self.assertLess(abs(stats['num_params'] / 83.9e9 - 1.0), 0.01)
    self.assertEqual(stats['bytes_per_param'], 12)  # RMSProp with momentum.
    self.assertEqual(stats['param_bytes'], 12 * stats['num_params'])
    # Table 1: 937.9G of parameter memory (GiB).
    self.assertLess(abs(stats['param_bytes'] / 2**30 / 937.9 - 1.0), 0.01)
    cells = stats['cells']
    self.assertLen(cells, 128)
    self.assertEqual(sum(c['num_layers'] for c in cells), 1663 + 3)
    self.assertEqual(sum(c['num_params'] for c in cells), stats['num_params'])
    self.assertEqual(sum(c['flops'] for c in cells),
                     stats['flops_per_example'])
    # Identical layers: the partitioner balances FLOPs to within one layer.
    flops = [c['flops'] for c in cells]
    self.assertLess(max(flops) / min(flops), 1.1)

  def testMatchesFPropMetaOfTheExperiment(self):
    params = model_registry.GetParams('mt.multilingual.T_24_8192_16')
    model = params.task.model
    metas = core.MetaOfSequence(model.layers, tuple(model.input_shapes))
    stats = model_stats.ModelStats(params)
    self.assertEqual(stats['num_params'], sum(m.num_params for m in metas))
    self.assertEqual(stats['flops_per_example'], sum(m.flops for m in metas))
    self.assertLen(stats['cells'], 4)
    self.assertEqual(stats['bytes_per_param'], 12)  # Adam: weight, m, v.
    stats8 = model_stats.ModelStats(params, num_partitions=8)
    self.assertLen(stats8['cells'], 8)
    self.assertEqual(stats8['num_params'], stats['num_params'])

  def testOverridesAsTheTrainerAppliesThem(self):
    out = _Run('--model=lm.synthetic.TransformerL_103', '--json',
               '--model_params_override=model.num_partitions : 4')
    self.assertLen(json.loads(out)['cells'], 4)
    params = model_registry.GetParams('lm.synthetic.TransformerL_103')
    base_experiment.ApplyOverrides(params, 'optimizer.momentum : 0.0')
    self.assertEqual(model_stats.ModelStats(params)['bytes_per_param'], 8)
    out = _Run('--model=lm.synthetic.TransformerL_3', '--bytes_per_param=4')
    self.assertIn('4 bytes per parameter', out)

  def testBytesPerParam(self):
    sgd = optimizers.SGD.Params()
    self.assertEqual(model_stats.OptimizerSlots(sgd), 0)
    self.assertEqual(model_stats.OptimizerSlots(sgd.Set(momentum=0.9)), 1)
    self.assertEqual(model_stats.OptimizerSlots(optimizers.AdamW.Params()), 2)
    rms = optimizers.RMSProp.Params().Set(momentum=0.9, centered=True)
    self.assertEqual(model_stats.OptimizerSlots(rms), 3)

  def testErrors(self):
    with self.assertRaisesRegex(model_registry.ModelNotFoundError,
                                'TransformerL'):
      _Run('--model=lm.synthetic.NoSuchModel')
    with self.assertRaises(partition.PartitionError):
      _Run('--model=lm.synthetic.TransformerL_3', '--num_partitions=7')
    with self.assertRaisesRegex(AttributeError, 'num_partitions'):
      _Run('--model=lm.synthetic.TransformerL_3',
           '--model_params_override=model.num_partition : 2')
    with self.assertRaisesRegex(model_stats.ModelStatsError, '--model'):
      _Run('--json')

  def testCommandLine(self):
    result = subprocess.run(
        [sys.executable, '-m', 'tools.plan.model_stats',
         '--model=lm.synthetic.TransformerL_13', '--json'],
        capture_output=True, text=True, cwd=_ROOT, timeout=120, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    self.assertLess(abs(stats['num_params'] / 785.8e6 - 1.0), 0.01)
    self.assertLen(stats['cells'], 1)

  def testMainExitsWithOneLine(self):
    flag_values = flags.FlagValues()
    model_stats.DefineFlags(flag_values)
    flag_values(['model_stats', '--model=lm.synthetic.TransformerL_13',
                 '--num_partitions=99'])
    with self.assertRaises(SystemExit) as e:
      model_stats.main(['model_stats'], flag_values)
    self.assertStartsWith(str(e.exception.code), 'model_stats: error: ')
    self.assertNotIn('\n', str(e.exception.code))


if __name__ == '__main__':
  tf.test.main()
