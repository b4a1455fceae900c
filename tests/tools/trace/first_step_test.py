"""Tests of tools/trace/first_step.py: the Grappler sum and one real configuration."""

import unittest

import test_utils

from gpipe_tf.pipeline import PipeliningLayer

from tools.trace import first_step

_LOG = """\
I0000 00:00:1.0 1 meta_optimizer.cc:1059] Starting optimization for grappler item: __inference_step_1
I0000 00:00:1.1 1 meta_optimizer.cc:973] model_pruner: Graph size after: 10 nodes (0), 9 edges (0), time = 47.5ms.
I0000 00:00:1.2 1 meta_optimizer.cc:973] constant_folding: Graph size after: 9 nodes (-1), 8 edges (-1), time = 2.5ms.
I0000 00:00:1.3 1 some_other.cc:12] not a pass, time = 1000ms.
"""


class FirstStepTest(unittest.TestCase):

  def testGrapplerSumsEveryPassAndNothingElse(self):
    self.assertAlmostEqual(first_step.GrapplerSeconds(_LOG), 0.05)

  def testAConfigurationRunsInItsOwnProcess(self):
    row = first_step._Run(  # pylint: disable=protected-access
        dict(dim=16, seq_len=4, batch_size=4, v=1, layers=4,
             schedule='plain', k=1, m=1, share='on'), test_utils.REPO_ROOT)
    for key in ('imports_s', 'trace_s', 'first_call_s', 'next_step_s'):
      self.assertGreater(row[key], 0, key)
    # The child's CPU, counted by this process (not its own, which is
    # near 0 while it waits): importing TensorFlow alone takes seconds.
    self.assertGreater(row['cpu_s'], 1.0)
    # The graph optimizer ran in the first call and its passes were read.
    self.assertGreater(row['grappler_s'], 0)
    self.assertLess(row['grappler_s'], row['first_call_s'])
    # Four identical blocks: the first is a kind of its own (no tape
    # watches its inputs), the other three share one trace.
    self.assertEqual((row['traces'], row['calls']), (2, 4))

  def testAPipelinedRowSplitsItsTracingIntoTheEnginesParts(self):
    row = first_step._Run(  # pylint: disable=protected-access
        dict(dim=16, seq_len=4, batch_size=4, v=1, layers=4,
             schedule='1f1b', k=2, m=2, share='on', next_steps=1),
        test_utils.REPO_ROOT)
    parts = row['tracing_parts_s']
    for name in ('cell programs', 'pieces', 'tick graph', 'optimizer'):
      self.assertGreater(parts[name], 0, name)
    # Each cell's forward is traced once, in its program (interpreter_test).
    self.assertEqual(parts['spec traces'], 0)
    # Each second counted once: the parts are within the tracing.
    self.assertLess(sum(parts.values()), row['trace_s'])

  def testGrapplerOffRunsNoPass(self):
    row = first_step._Run(  # pylint: disable=protected-access
        dict(dim=16, seq_len=4, batch_size=4, v=1, layers=2,
             schedule='plain', k=1, m=1, share='on', grappler='off',
             next_steps=1), test_utils.REPO_ROOT)
    self.assertEqual(row['grappler_s'], 0)
    self.assertGreater(row['next_step_s'], 0)

  def testOnlyTheRematAskedForIsSet(self):
    # In-process: the layer is built, not run (one logical device, K=1).
    config = dict(dim=8, seq_len=4, batch_size=4, v=1, layers=2,
                  schedule='1f1b', k=1, m=2, share='on')
    default = first_step._Net(dict(config, remat='default'))  # pylint: disable=protected-access
    self.assertEqual(default.params.remat,
                     PipeliningLayer.Params().remat)
    for remat in ('except_last', 'never'):
      net = first_step._Net(dict(config, remat=remat))  # pylint: disable=protected-access
      self.assertEqual(net.params.remat, remat)


if __name__ == '__main__':
  unittest.main()
