"""pipeline/transfers.py: how a device is named in the counts of tensors that cross devices."""

from absl.testing import absltest

from gpipe_tf.pipeline import transfers


class DeviceKeyTest(absltest.TestCase):

  def testThisProcessesDevicesByTypeAndIndexOtherProcessesWithTheirTask(self):
    self.assertEqual(transfers.DeviceKey('/device:CPU:1'), 'CPU:1')
    self.assertEqual(
        transfers.DeviceKey('/job:localhost/replica:0/task:0/device:CPU:1'),
        'CPU:1')
    # Every worker's first CPU is CPU:0: without its task, K workers would
    # count as one device.
    keys = {transfers.DeviceKey(f'/job:worker/replica:0/task:{k}/device:CPU:0')
            for k in range(3)}
    self.assertEqual(keys, {f'/job:worker/task:{k}/CPU:0' for k in range(3)})


if __name__ == '__main__':
  absltest.main()
