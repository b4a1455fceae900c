"""Tests of gpipe_tf.runtime.devices: splitting the CPU, refusing to after TensorFlow started, default devices."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import os  # pylint: disable=g-import-not-at-top
import subprocess
import sys

import tensorflow as tf

from gpipe_tf.runtime import devices


class DevicesTest(tf.test.TestCase):

  def testTheTestProcessHasItsLogicalCpus(self):
    cpus = devices.LogicalCpus()
    self.assertLen(cpus, test_utils.NUM_TEST_DEVICES)
    self.assertEqual(devices.DefaultDevices(), cpus)  # No GPU here.
    # Asking again for the same split is a no-op.
    self.assertEqual(devices.SplitCpu(test_utils.NUM_TEST_DEVICES), cpus)

  def testAnotherSplitAfterStartIsANamedError(self):
    with self.assertRaisesRegex(devices.DeviceConfigError,
                                'before running any op'):
      devices.SplitCpu(test_utils.NUM_TEST_DEVICES + 1)
    with self.assertRaises(ValueError):
      devices.ConfigureCpuSplit(0)

  def testOnHostKeepsThisProcessesDevices(self):
    host = tf.DeviceSpec.from_string('/job:worker/replica:0/task:1')
    on_host = devices._OnHost  # pylint: disable=protected-access
    self.assertTrue(on_host('/job:worker/replica:0/task:1/device:CPU:0', host))
    self.assertTrue(on_host('/device:CPU:0', host))
    self.assertFalse(on_host('/job:worker/replica:0/task:0/device:CPU:0',
                             host))

  def testFreshProcessSplitSetsThreadsAndAllocator(self):
    code = ('from gpipe_tf.runtime import devices; import os; '
            'import tensorflow as tf; print(devices.SplitCpu(3)); '
            'print(tf.config.threading.get_inter_op_parallelism_threads(), '
            'tf.config.threading.get_intra_op_parallelism_threads(), '
            "os.environ['TF_CPU_ALLOCATOR_USE_BFC'])")
    env = {k: v for k, v in os.environ.items()
           if k != 'TF_CPU_ALLOCATOR_USE_BFC'}
    env['TF_CPP_MIN_LOG_LEVEL'] = '3'
    out = subprocess.run([sys.executable, '-c', code], cwd=test_utils.REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    self.assertEqual(out[0], str([f'/device:CPU:{i}' for i in range(3)]))
    inter, intra, bfc = out[1].split()
    self.assertEqual(int(inter), 3)
    self.assertEqual(int(intra), max(1, (os.cpu_count() or 1) // 3))
    self.assertEqual(bfc, 'true')


if __name__ == '__main__':
  tf.test.main()
