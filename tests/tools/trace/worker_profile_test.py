"""tools/trace/worker_profile.py: a worker's ops from its profile, and how long its sends waited."""

from unittest import mock

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tools.trace import worker_profile as wp

_CALL = 'EagerLocalExecuteAsync: __inference_step_12_partitioned_34_1'


def _Space(events):
  """An XSpace of one host plane, one line, events (name, start ms, ms)."""
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name='/host:CPU')
  line = plane.lines.add(name='tf_Compute/1', timestamp_ns=1_000_000)
  ids = {}
  for name, start, ms in events:
    if name not in ids:
      ids[name] = len(ids) + 1
      plane.event_metadata[ids[name]].id = ids[name]
      plane.event_metadata[ids[name]].name = name
    line.events.add(metadata_id=ids[name], offset_ps=int(start * 1e9),
                    duration_ps=int(ms * 1e9))
  return space


def _Op(action, op, start, ms, kind='MatMul', loop=False):
  prefix = 'while/body/_5/while/' if loop else ''
  return (f'{prefix}{action}/StatefulPartitionedCall/{op}:{kind}', start, ms)


class WorkerProfileTest(tf.test.TestCase):

  def testAWorkerWithoutAProfileIsANamedError(self):
    ran = []
    # The profiler "ran" and wrote nothing (its server was not there).
    with mock.patch.object(tf.profiler.experimental.client, 'trace',
                           lambda *args: None):
      with self.assertRaisesRegex(wp.NoProfileError,
                                  'no profile for worker localhost:1234'):
        wp.Capture(['localhost:1234'], lambda: ran.append(1),
                   self.get_temp_dir(), duration_ms=10, delay_seconds=0)
    self.assertEqual(ran, [1])

  def testOpsAndStepCallsAreReadAndRuntimeEventsAreNot(self):
    ops, starts = wp.FromSpace(_Space([
        (_CALL, 0, 50), ('ThreadpoolListener::Record', 1, 0),
        ('ExecutorState::Process', 1, 3), ('MemoryAllocation', 2, 0),
        _Op('stage0_F_mb0', 'MatMul', 2, 3), (_CALL, 20, 50),
        ('stage0_F_mb0/TensorArrayV2Read/TensorListGetItem:TensorListGetItem',
         1, 0.5)]))
    self.assertEqual(starts, [1.0, 21.0])  # The line starts at 1 ms.
    self.assertEqual([(o.start, o.kind, o.action) for o in ops],
                     [(2.0, 'TensorListGetItem', 'stage0_F_mb0'),
                      (3.0, 'MatMul', 'stage0_F_mb0')])

  def testAReceiptBelongsToNoAction(self):
    # What a stage takes in at a tick is under its own scope, no action's.
    self.assertIsNone(wp.Op(0, 1, 'stage1_RECV_t4/TensorArrayV2Write/'
                            'TensorListSetItem', 'TensorListSetItem').action)
    self.assertEqual(wp.Op(0, 1, 'stage1_F_t4/MatMul', 'MatMul').action,
                     'stage1_F_t4')

  def testALateSendWaitsFromTheEndOfItsAction(self):
    ops, _ = wp.FromSpace(_Space([
        _Op('stage2_F_mb6', 'MatMul', 0, 10),
        _Op('stage2_F_mb6', 'add_0', 10, 1, kind='AddV2'),
        _Op('stage0_BW_mb4', 'MatMul', 11, 30),
        # Sent after the next action: 31 ms after F ended.
        _Op('stage2_F_mb6', 'add_0/_147', 42, 0.2, kind='_Send'),
        # The BW's dx, sent while its weight gradients still ran: no wait.
        _Op('stage0_BW_mb4', 'AddN_5/_99', 30, 0.2, kind='_Send'),
        # An input the call passed through, and a slot the action read:
        # not tensors its piece made.
        ('Func/stage2_F_mb6/StatefulPartitionedCall/input/_2/_7:_Send', 43,
         0.1),
        ('stage2_F_mb6/TensorArrayV2Read_1/TensorListGetItem/_5:_Send', 44,
         0.1)]))
    lags = wp.SendLags(sorted(ops, key=lambda o: o.start))
    self.assertEqual([(s.action, s.lag) for s in lags],
                     [('stage0_BW_mb4', 0.0), ('stage2_F_mb6', 31.0)])
    self.assertEqual(lags[1].at, 42.0)

  def testALoopsDeadExitSendIsLeftOut(self):
    # Two iterations of a loop body's F_t10 and its Send, then the Send of
    # the loop's dead exit, long after.
    events = []
    for start in (0, 100):
      events += [_Op('stage2_F_t10', 'MatMul', start, 10, loop=True),
                 _Op('stage2_F_t10', 'add/_157', start + 15, 0.1,
                     kind='_Send', loop=True)]
    events.append(_Op('stage2_F_t10', 'add/_157', 300, 0.1, kind='_Send',
                      loop=True))
    ops, _ = wp.FromSpace(_Space(events))
    self.assertEqual([s.lag for s in wp.SendLags(ops)], [5.0, 5.0])

  def testSummarizeKeepsCompleteStepsAndReportsTheLags(self):
    events = [(_CALL, 0, 1), _Op('stage0_F_mb0', 'MatMul', 1, 4),
              _Op('stage0_F_mb0', 'MatMul_1', 3, 4),  # Overlaps: busy 6.
              _Op('stage0_F_mb0', 'y/_1', 9, 0.5, kind='_Send'),
              (_CALL, 20, 1), _Op('stage0_F_mb0', 'MatMul', 21, 2),
              _Op('stage0_F_mb0', 'y/_1', 23, 0.5, kind='_Send'),
              (_CALL, 40, 1), _Op('stage0_F_mb0', 'MatMul', 41, 1)]
    profile = wp.Summarize('worker 0', *wp.FromSpace(_Space(events)))
    self.assertLen(profile.step_ms, 2)  # The last call has no next one.
    self.assertAllClose(profile.step_ms, [8.5, 2.5])
    self.assertAllClose(profile.busy_ms, [6.5, 2.5])
    self.assertEqual([[s.lag for s in step] for step in profile.lags],
                     [[2.0], [0.0]])
    self.assertEqual(profile.threads, 1)
    report = wp.Report([profile, wp.WorkerProfile('worker 1', [], [], [])],
                       top=1)
    self.assertEqual(report.splitlines(), [
        'worker 0: 2 steps, step 5.5 ms, ops busy 4.5 ms on 1 thread; 1 '
        'sends a step, '
        'lag median 1.0 ms, p90 2.0, max 2.0, 1.0 ms a step',
        '      2.0 ms  stage0_F_mb0 at 8.0 ms (stage0_F_mb0/'
        'StatefulPartitionedCall/y/_1)',
        'worker 1: no complete step in the profile'])


if __name__ == '__main__':
  tf.test.main()
