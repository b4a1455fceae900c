"""R replicas x K cells (gpipe_tf.runtime.distribute) train exactly like one device on the global batch."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import dataclasses  # pylint: disable=g-import-not-at-top
import os
import shutil
import tempfile
from unittest import mock

from absl import logging as absl_logging
from absl.testing import flagsaver
import pytest
import tensorflow as tf

from gpipe_tf.runtime import distribute
from gpipe_tf import pipeline
from gpipe_tf import trainer
from gpipe_tf.train import loop
from gpipe_tf.layers import normalization
from gpipe_tf.pipeline import engine
from gpipe_tf.pipeline.schedule import periods
from params.synthetic import mlp

NUM_STEPS = 3


class _Plain(mlp.Tiny):
  """Tiny without dropout: one device, SequentialLayer."""

  WITH_BATCH_NORM = False

  def Task(self):
    p = super().Task()
    layers = [l for l in p.model.layers if l.name != 'dropout']
    if self.WITH_BATCH_NORM:
      # First, on the inputs: its statistics do not depend on the weights.
      layers.insert(0, normalization.BatchNormLayer.Params().Set(
          name='bn', dim=self.INPUT_DIM, decay=0.0))
    p.model.layers = layers
    return p


class _Piped(_Plain):
  """The same layers as a 2-cell pipeline over 2 micro-batches."""

  def Task(self):
    p = super().Task()
    p.model = pipeline.PipeliningLayer.Params().Set(
        name=p.model.name, layers=p.model.layers, num_partitions=2,
        num_micro_batches=2, remat='always',
        input_shapes=[(None, self.INPUT_DIM)])
    return p


class _PlainBatchNorm(_Plain):
  WITH_BATCH_NORM = True


class _PipedBatchNorm(_Piped):
  WITH_BATCH_NORM = True


def _Variant(base, **params):
  """`base` with these PipeliningLayer Params set."""

  class _Variant(base):

    def Task(self):
      p = super().Task()
      p.model.Set(**params)
      return p

  _Variant.__name__ = base.__name__ + ''.join(sorted(params))
  return _Variant


# One xdist worker runs the class, so that its tests share the runs _Run
# trains once.
@pytest.mark.xdist_group('distribute_test')
class DistributeTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._root = tempfile.mkdtemp()
    cls._runs = {}

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls._root, ignore_errors=True)
    super().tearDownClass()

  def _Run(self, experiment, num_replicas=1, **pipeline_params):
    """NUM_STEPS steps of `experiment` (these PipeliningLayer Params set):
    (RunResult, checkpoint values, the executions periods.Plan was asked
    for). Each run trains once for the class: several tests compare the
    same runs (the references of one device, 2 replicas of the default
    execution)."""
    key = (experiment, num_replicas, tuple(sorted(pipeline_params.items())))
    if key not in self._runs:
      logdir = os.path.join(self._root, f'run{len(self._runs)}')
      if pipeline_params:
        experiment = _Variant(experiment, **pipeline_params)
      with mock.patch.object(periods, 'Plan', autospec=True,
                             side_effect=periods.Plan) as called:
        result = loop.train_and_evaluate(experiment, logdir, 'train',
                                         max_steps=NUM_STEPS,
                                         num_replicas=num_replicas)
      self._runs[key] = (result, test_utils.CheckpointValues(logdir),
                         {c.args[1] for c in called.call_args_list})
    return self._runs[key]

  def testTwoReplicasOfTwoCellsEqualOneDevice(self):
    _, a, _ = self._Run(_Plain)
    result, b, _ = self._Run(_Piped, num_replicas=2)
    self.assertEqual(result.global_step, NUM_STEPS)
    self.assertEqual(sorted(a), sorted(b))
    self.assertGreater(len(a), 6)  # Weights, Adam slots, global step.
    for name in a:
      self.assertAllClose(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    self.assertGreater(result.train_metrics['grad_norm'], 0.0)

  def testResumedDistributedRunEqualsUninterruptedOne(self):
    # The uninterrupted run is the class's NUM_STEPS-step run of 2 replicas
    # (shared with testTwoReplicasOfTwoCellsEqualOneDevice).
    resumed = self.get_temp_dir() + '/resumed'
    loop.train(_Piped, resumed, NUM_STEPS - 1, num_replicas=2)
    second = loop.train(_Piped, resumed, NUM_STEPS, num_replicas=2)
    self.assertEqual(second.start_step, NUM_STEPS - 1)
    _, b, _ = self._Run(_Piped, num_replicas=2)
    a = test_utils.CheckpointValues(resumed)
    self.assertEqual(sorted(a), sorted(b))
    for name in a:
      self.assertAllEqual(a[name], b[name], msg=name)

  def testCrossReplicaBatchNormStatisticsAreTheGlobalBatchs(self):
    _, a, _ = self._Run(_PlainBatchNorm)
    _, b, _ = self._Run(_PipedBatchNorm, num_replicas=2)
    stats = [k for k in a if 'moving_' in k]
    self.assertLen(stats, 2)
    # decay=0: the moving statistics are exactly those of the last
    # (NUM_STEPS-th) global batch, and the same as one device's.
    batch = list(_PlainBatchNorm().Train().Instantiate().GetDataset().take(
        NUM_STEPS))
    x = batch[-1]['inputs'].numpy()
    mean = [a[k] for k in stats if 'moving_mean' in k][0]
    variance = [a[k] for k in stats if 'moving_variance' in k][0]
    self.assertAllClose(mean, x.mean(0), atol=1e-5)
    self.assertAllClose(variance, x.var(0), atol=1e-4)
    for k in stats:
      self.assertAllClose(a[k], b[k], atol=1e-5, msg=k)

  def testBothExecutionsPerReplicaEqualOneDevice(self):
    # Each replica's cells trace their programs in that replica's context
    # (its copies of the variables, its devices) and run their own loops (or
    # unrolled steps); BatchNorm statistics are still summed across replicas.
    # 'loop' is the default: the runs of the tests above (the plan below
    # shows it). One run fewer than execution x model: 'unrolled' trains the
    # BatchNorm model only; its statistics equal one device's, and all its
    # values 'loop''s (whose weights equal one device's without BatchNorm).
    # (BatchNorm normalizes each micro-batch by its own statistics: its
    # weights do not equal one device's.)
    _, plain, _ = self._Run(_Plain)
    _, plain_bn, _ = self._Run(_PlainBatchNorm)
    stats = [k for k in plain_bn if 'moving_' in k]
    self.assertLen(stats, 2)
    _, values, planned = self._Run(_Piped, num_replicas=2)
    self.assertEqual(planned, {'loop'})  # Each replica's step as asked.
    self.assertEqual(sorted(plain), sorted(values))
    for key in plain:  # Weights, Adam slots, global step.
      self.assertAllClose(plain[key], values[key], rtol=1e-4, atol=1e-5,
                          msg=key)
    _, loop_bn, planned = self._Run(_PipedBatchNorm, num_replicas=2)
    self.assertEqual(planned, {'loop'})
    _, unrolled_bn, planned = self._Run(_PipedBatchNorm, num_replicas=2,
                                        execution='unrolled')
    self.assertEqual(planned, {'unrolled'})
    for execution, values in (('loop', loop_bn), ('unrolled', unrolled_bn)):
      for key in stats:
        self.assertAllClose(plain_bn[key], values[key], atol=1e-5,
                            msg=f'{execution} {key}')
    self.assertEqual(sorted(loop_bn), sorted(unrolled_bn))
    self.assertGreater(len(loop_bn), 6)
    for key in loop_bn:  # Weights, Adam slots, statistics, global step.
      self.assertAllClose(loop_bn[key], unrolled_bn[key], rtol=1e-4,
                          atol=1e-5, msg=key)

  def testEachReplicaPipelinesOnItsOwnDevices(self):
    cpus = test_utils.devices.LogicalCpus()
    strategy = distribute.MakeStrategy(2, 2)
    self.assertEqual(strategy.num_replicas_in_sync, 2)
    with strategy.scope():
      pipe = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=_Plain().Task().model.layers, num_partitions=2,
          num_micro_batches=2).Instantiate()
    for v in pipe.trainable_variables:  # Components on each replica's device 0.
      self.assertEqual([tf.DeviceSpec.from_string(c.device).device_index
                        for c in v.values], [0, 2])
    seen = {}
    run_pipeline = engine.RunPipeline

    def _Recording(cells, *args, **kwargs):
      replica = distribute.ReplicaId()
      seen[replica] = [c.device for c in cells]
      return run_pipeline(cells, *args, **kwargs)

    engine.RunPipeline = _Recording
    try:
      x = tf.random.stateless_normal([8, 16], [1, 2])
      tf.function(lambda: strategy.run(
          lambda: pipe.FProp(x, training=True)))()
    finally:
      engine.RunPipeline = run_pipeline
    self.assertEqual(seen, {0: cpus[0:2], 1: cpus[2:4]})

  def testTrainerFlagLogsTheLayout(self):
    # The trainer's main() in this process (its 4 logical CPUs are the split
    # --num_logical_devices=4 asks for): a subprocess would cost a TensorFlow
    # import. The binary as a process with --num_replicas=2:
    # trainer_test.TrainerSplitsTheCpuTest.testReplicasTimesCells.
    test_utils.MarkFlagsParsed()
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.INFO)
    self.addCleanup(absl_logging.set_verbosity, verbosity)
    with flagsaver.flagsaver(
        model='synthetic.mlp.TinyPipelined', mode='train',
        logdir=f'{self.get_temp_dir()}/cli', max_steps=2, num_replicas=2,
        num_logical_devices=4):
      with self.assertLogs(level='INFO') as logs:
        trainer.main(['trainer'])
    text = '\n'.join(logs.output)
    self.assertIn('MirroredStrategy: 2 replicas x 2 cells', text)
    self.assertIn('Replica 1: cell 0 on /device:CPU:2, cell 1 on '
                  '/device:CPU:3', text)
    self.assertIn('Done at global step 2', text)

  def testNumReplicasThatFitUsesEveryDevice(self):
    four = [f'/device:CPU:{i}' for i in range(4)]
    self.assertEqual(distribute.NumReplicasThatFit(1, four), 4)
    self.assertEqual(distribute.NumReplicasThatFit(2, four), 2)
    self.assertEqual(distribute.NumReplicasThatFit(3, four), 1)
    self.assertEqual(distribute.NumReplicasThatFit(8, four), 1)
    with self.assertRaises(distribute.ReplicaLayoutError):
      distribute.NumReplicasThatFit(0, four)

  def testNumReplicasZeroTrainsOnEveryDevice(self):
    # absl logs INFO only while its verbosity allows it: a test that parsed
    # absl flags earlier in this process set it to WARNING (a CI run).
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.INFO)
    self.addCleanup(absl_logging.set_verbosity, verbosity)
    with self.assertLogs(level='INFO') as logs:
      result = loop.train(_Piped, self.get_temp_dir() + '/auto', 1,
                               num_replicas=0)
    self.assertEqual(result.global_step, 1)
    text = '\n'.join(logs.output)
    self.assertIn('MirroredStrategy: 2 replicas x 2 cells', text)
    self.assertIn('cell 1 on /device:CPU:3', text)
    with self.assertRaisesRegex(ValueError, 'num_replicas'):
      loop.train(_Piped, self.get_temp_dir() + '/bad', 1,
                      num_replicas=-1)

  def testTooFewDevicesIsANamedError(self):
    with self.assertRaisesRegex(distribute.ReplicaLayoutError, '6 devices'):
      distribute.MakeStrategy(3, 2)


class ReplicaLayoutTest(tf.test.TestCase):
  """Where each replica's cells run, planned once (pure, given the devices)."""

  FOUR = [f'/device:CPU:{i}' for i in range(4)]

  def testPlanCutsTheDevicesIntoReplicaGroups(self):
    layout = distribute.ReplicaLayout.Plan(2, 2, self.FOUR)
    self.assertEqual(layout.num_replicas, 2)
    self.assertEqual(layout.devices_per_replica, 2)
    self.assertEqual(layout.devices, (tuple(self.FOUR[0:2]),
                                      tuple(self.FOUR[2:4])))
    self.assertEqual(layout.strategy_devices, [self.FOUR[0], self.FOUR[2]])
    self.assertEqual((layout.task, layout.is_chief), ('', True))
    self.assertEqual(layout.Describe(), [
        '2 replicas x 2 cells per replica.',
        'Replica 0: cell 0 on /device:CPU:0, cell 1 on /device:CPU:1',
        'Replica 1: cell 0 on /device:CPU:2, cell 1 on /device:CPU:3'])
    with self.assertRaises(dataclasses.FrozenInstanceError):
      layout.task = 'worker:0'

  def testZeroReplicasUsesEveryDevice(self):
    self.assertEqual(distribute.ReplicaLayout.Plan(0, 1, self.FOUR)
                     .num_replicas, 4)
    self.assertEqual(distribute.ReplicaLayout.Plan(0, 3, self.FOUR).devices,
                     (tuple(self.FOUR[:3]),))
    # Default devices: the 4 logical CPUs of the test process.
    self.assertEqual(distribute.ReplicaLayout.Plan(0, 2).devices,
                     (tuple(test_utils.devices.LogicalCpus()[0:2]),
                      tuple(test_utils.devices.LogicalCpus()[2:4])))

  def testTooFewDevicesForSeveralReplicasIsANamedError(self):
    with self.assertRaisesRegex(distribute.ReplicaLayoutError,
                                '3 replicas x 2 cells need 6 devices'):
      distribute.ReplicaLayout.Plan(3, 2, self.FOUR)
    with self.assertRaisesRegex(distribute.ReplicaLayoutError, 'num_cells'):
      distribute.ReplicaLayout.Plan(1, 0, self.FOUR)
    with self.assertRaisesRegex(distribute.ReplicaLayoutError,
                                'num_replicas must be >= 0'):
      distribute.ReplicaLayout.Plan(-1, 2, self.FOUR)
    # One replica is left to the pipeline, which names what would fit.
    self.assertEqual(distribute.ReplicaLayout.Plan(1, 8, self.FOUR).devices,
                     (tuple(self.FOUR),))

  def testStrategyAndLayoutAgree(self):
    layout = distribute.ReplicaLayout.Plan(2, 2)
    self.assertIsNone(distribute.ReplicaLayout.Plan(1, 2).MakeStrategy())
    strategy = layout.MakeStrategy()
    self.assertEqual(strategy.num_replicas_in_sync, 2)
    self.assertEqual(
        [tf.DeviceSpec.from_string(d).device_index
         for d in strategy.extended.worker_devices], [0, 2])
    self.assertEqual(distribute.ReplicaLayout.FromStrategy(strategy, 2),
                     layout)
    self.assertEqual(distribute.ReplicaLayout.FromStrategy(None, 2),
                     distribute.ReplicaLayout.Plan(1, 2))
    with self.assertRaisesRegex(distribute.ReplicaLayoutError,
                                'MakeMultiWorkerStrategy'):
      dataclasses.replace(layout, task='worker:1').MakeStrategy()


class SeveralHostsTest(tf.test.TestCase):
  """The pure parts of the multi-worker layout (the job itself: multi_worker_test)."""

  def testEveryReplicaPipelinesOnItsOwnTasksDevices(self):
    names = ['/job:worker/replica:0/task:1/device:CPU:10',
             '/job:worker/replica:0/task:1/device:CPU:0',
             '/job:worker/replica:0/task:0/device:CPU:1',
             '/job:chief/replica:0/task:0/device:CPU:0',
             '/job:worker/replica:0/task:1/device:CPU:2',
             '/job:worker/replica:0/task:0/device:CPU:0',
             '/job:chief/replica:0/task:0/device:CPU:1']
    order = [('chief', 0), ('worker', 0), ('worker', 1)]
    self.assertEqual(distribute.WorkerGroups(order, names, 2), [
        ['/job:chief/replica:0/task:0/device:CPU:0',
         '/job:chief/replica:0/task:0/device:CPU:1'],
        ['/job:worker/replica:0/task:0/device:CPU:0',
         '/job:worker/replica:0/task:0/device:CPU:1'],
        ['/job:worker/replica:0/task:1/device:CPU:0',   # By index: 0, 2, 10.
         '/job:worker/replica:0/task:1/device:CPU:2']])
    with self.assertRaisesRegex(
        distribute.ReplicaLayoutError,
        r'Task chief:0 has 2 devices .* each replica pipelines 3 cells'):
      distribute.WorkerGroups(order, names, 3)

  def testShareOfBatchSplitsRowsContiguously(self):
    batch = {'inputs': tf.reshape(tf.range(20), [10, 2]),
             'labels': tf.range(10), 'step': tf.constant(7)}
    shares = [distribute.ShareOfBatch(batch, r, 4) for r in range(4)]
    self.assertEqual([int(s['labels'].shape[0]) for s in shares],
                     [3, 3, 2, 2])
    self.assertAllEqual(tf.concat([s['inputs'] for s in shares], 0),
                        batch['inputs'])
    self.assertAllEqual(tf.concat([s['labels'] for s in shares], 0),
                        batch['labels'])
    for share in shares:
      self.assertEqual(int(share['step']), 7)  # Rank 0: shared.
    # Inside a traced dataset map, with an unknown batch size.
    dataset = tf.data.Dataset.from_tensors(batch).map(
        lambda b: distribute.ShareOfBatch(b, 1, 2))
    self.assertAllEqual(next(iter(dataset))['labels'], [5, 6, 7, 8, 9])


if __name__ == '__main__':
  tf.test.main()
