"""Tests of gpipe_tf.train.loop and trainer: resume, summaries, CLI."""

import hashlib
import os
import shutil
import re
import subprocess
import json
import sys
import tempfile
from unittest import mock


from absl import flags  # pylint: disable=g-import-not-at-top
from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.checkpoint import functional_saver  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

import test_utils  # pylint: disable=g-import-not-at-top,g-bad-import-order

from gpipe_tf import base_experiment  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import checkpoints  # pylint: disable=g-import-not-at-top
from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import loop  # pylint: disable=g-import-not-at-top
from gpipe_tf import trainer  # pylint: disable=g-import-not-at-top
from params.synthetic import mlp  # pylint: disable=g-import-not-at-top

_REPO_ROOT = test_utils.REPO_ROOT

_Scalars = test_utils.Scalars  # {tag: {step: value}} of a summary directory.
_Checkpoint = test_utils.CheckpointValues  # Values of logdir/ckpt/ckpt-<step>.

FLAGS = flags.FLAGS
RUN_ARGS = dict(save_interval_steps=10, log_interval_steps=5)
TRAIN_TAGS = {'loss', 'accuracy', 'learning_rate', 'grad_norm',
              'steps_per_sec', 'examples_per_sec'}
# Overrides giving Tiny another hidden size: a different, incompatible model.
WIDER = ('model.layers[0].output_dim : 32; model.layers[2].input_dim : 32')


def _Snapshot(directory):
  """{relative path: (mtime, sha1)} of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, directory)] = (
            os.stat(path).st_mtime_ns, hashlib.sha1(f.read()).hexdigest())
  return out


class TrainLibTest(tf.test.TestCase):
  """One run to 20 steps resumed to 40, and one uninterrupted run to 40.

  The binary is also run for real (two subprocesses) and compared with them.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.resumed = os.path.join(cls.root, 'resumed')
    cls.at20 = os.path.join(cls.root, 'at20')
    cls.first = loop.train_and_evaluate(mlp.Tiny, cls.resumed,
                                             max_steps=20, **RUN_ARGS)
    shutil.copytree(cls.resumed, cls.at20)
    cls.second = loop.train_and_evaluate(mlp.Tiny, cls.resumed,
                                              max_steps=40, **RUN_ARGS)
    cls.straight_dir = os.path.join(cls.root, 'straight')
    cls.straight = loop.train_and_evaluate(mlp.Tiny, cls.straight_dir,
                                                max_steps=40, **RUN_ARGS)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _Copy(self, source):
    target = os.path.join(tempfile.mkdtemp(dir=self.root), 'logdir')
    shutil.copytree(source, target)
    return target

  def testTrainAndEvalSummaries(self):
    at20 = _Scalars(os.path.join(self.at20, 'train'))
    self.assertContainsSubset(TRAIN_TAGS, set(at20))
    self.assertEqual(sorted(at20['loss']), [5, 10, 15, 20])
    self.assertAllClose(at20['learning_rate'][20], 0.01)
    self.assertEqual(set(_Scalars(os.path.join(self.at20, 'eval'))['accuracy']),
                     {20})
    resumed_eval = _Scalars(os.path.join(self.resumed, 'eval'))
    self.assertContainsSubset({'loss', 'accuracy'}, set(resumed_eval))
    self.assertEqual(sorted(resumed_eval['accuracy']), [20, 40])
    self.assertAllClose(resumed_eval['accuracy'][40],
                        self.second.eval_metrics['accuracy'])
    resumed_train = _Scalars(os.path.join(self.resumed, 'train'))
    self.assertEqual(sorted(resumed_train['loss']), list(range(5, 41, 5)))

  def testCheckpointsAndParamsText(self):
    self.assertEqual(self.first.global_step, 20)
    self.assertIsNone(self.first.restored_checkpoint)
    names = os.listdir(os.path.join(self.at20, 'ckpt'))
    self.assertIn('ckpt-20.index', names)
    self.assertIn('ckpt-10.index', names)
    self.assertEqual(_Checkpoint(self.at20, 20)[
        'global_step/.ATTRIBUTES/VARIABLE_VALUE'], 20)
    with open(os.path.join(self.at20, 'params.txt')) as f:
      self.assertEqual(f.read(), base_experiment.AsExperimentParams(
          mlp.Tiny).ToText() + '\n')
    # Resuming does not rewrite params.txt.
    self.assertEqual(_Snapshot(self.at20)['params.txt'],
                     _Snapshot(self.resumed)['params.txt'])

  def testResumedAtStep20(self):
    self.assertEqual(self.second.start_step, 20)
    self.assertEqual(checkpoints.CheckpointStep(
        self.second.restored_checkpoint), 20)
    self.assertEqual(self.second.global_step, 40)
    self.assertEqual(_Checkpoint(self.resumed, 40)[
        'global_step/.ATTRIBUTES/VARIABLE_VALUE'], 40)

  def testResumedEqualsUninterrupted(self):
    # The training set (16 batches) is shorter than 40 steps: it repeats, and
    # the resumed input continues mid-epoch.
    train = mlp.Tiny().Train()
    self.assertLess(train.num_examples // train.batch_size, 20)
    resumed = _Checkpoint(self.resumed, 40)
    straight = _Checkpoint(self.straight_dir, 40)
    self.assertEqual(set(resumed), set(straight))
    # 6 model variables, each with Adam's 2 slots, the step counters.
    self.assertGreaterEqual(len(resumed), 6 * 3 + 2)
    for key in resumed:
      self.assertAllEqual(resumed[key], straight[key], msg=key)
    self.assertEqual(self.second.eval_metrics, self.straight.eval_metrics)

  def testLearnsClearlyBetterThanChance(self):
    self.assertGreater(self.straight.eval_metrics['accuracy'], 0.6)  # 4 classes
    self.assertLess(self.straight.train_metrics['loss'], 0.6 * np.log(4))

  def testRunAlreadyAtMaxStepsOnlyEvaluates(self):
    logdir = self._Copy(self.at20)
    result = loop.train_and_evaluate(mlp.Tiny, logdir, max_steps=20)
    self.assertEqual((result.start_step, result.global_step), (20, 20))
    self.assertEqual(result.train_metrics, {})
    self.assertAllClose(result.eval_metrics, self.first.eval_metrics)

  def testPeriodicEvaluation(self):
    logdir = self._Copy(self.at20)
    result = loop.train_and_evaluate(
        mlp.Tiny, logdir, max_steps=23, eval_interval_steps=2, eval_steps=1,
        log_interval_steps=1)
    self.assertEqual(result.global_step, 23)
    evals = _Scalars(os.path.join(logdir, 'eval'))['num_examples']
    self.assertEqual(evals, {20: 256.0, 22: 32.0, 23: 32.0})
    self.assertEqual(sorted(_Scalars(os.path.join(logdir, 'train'))['loss']),
                     [5, 10, 15, 20, 21, 22, 23])

  def testEvaluateMode(self):
    logdir = self._Copy(self.at20)
    shutil.rmtree(os.path.join(logdir, 'eval'))
    result = loop.evaluate(mlp.Tiny, logdir, eval_steps=2)
    self.assertEqual(result.global_step, 20)
    self.assertEqual(_Scalars(os.path.join(logdir, 'eval'))['num_examples'],
                     {20: 64.0})  # 2 batches of 32.
    whole = loop.evaluate(mlp.Tiny, logdir)
    self.assertAllClose(whole.eval_metrics, self.first.eval_metrics)
    empty = os.path.join(self.root, 'never_trained')
    with self.assertRaises(checkpoints.NoCheckpointError):
      loop.evaluate(mlp.Tiny, empty)
    self.assertFalse(os.path.exists(empty))

  def testIncompatibleLogdirRefusedUntouched(self):
    logdir = self._Copy(self.at20)
    before = _Snapshot(logdir)
    params = model_registry.GetParams('synthetic.mlp.Tiny')
    base_experiment.ApplyOverrides(params, WIDER)
    with self.assertRaisesRegex(
        checkpoints.IncompatibleCheckpointError,
        r"'task/model/fc0/w'.*\[16, 32\] in the model but \[16, 64\]"):
      loop.train_and_evaluate(params, logdir, max_steps=40)
    self.assertEqual(_Snapshot(logdir), before)

  def _Run(self, logdir, max_steps, *extra_flags):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    return subprocess.run(
        [sys.executable, '-m', 'gpipe_tf.trainer',
         '--model=synthetic.mlp.Tiny', f'--logdir={logdir}',
         f'--max_steps={max_steps}', '--save_interval_steps=10',
         '--log_interval_steps=10', *extra_flags],
        cwd=_REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False)

  def testCliTrainsThenResumes(self):
    logdir = os.path.join(self.root, 'cli')
    first = self._Run(logdir, 20, '--num_logical_devices=2', '--num_replicas=1')
    self.assertEqual(first.returncode, 0, first.stderr[-3000:])
    self.assertIn('Step 20/20', first.stderr)
    self.assertIn('Eval at step 20', first.stderr)
    self.assertRegex(first.stdout, r'Final evaluation at global step 20: '
                     r'accuracy=0\.\d{4}, loss=')
    self.assertTrue(os.path.exists(os.path.join(logdir, 'ckpt',
                                                'ckpt-20.index')))
    # No --num_logical_devices: a one-device model is not split (this run
    # is TrainerSplitsTheCpuTest's case of a 1-device model, one process
    # fewer).
    second = self._Run(logdir, 40)
    self.assertEqual(second.returncode, 0, second.stderr[-3000:])
    self.assertNotIn('Split the CPU', second.stderr)
    self.assertRegex(second.stderr, r'Resuming from \S*ckpt-20 at global '
                     r'step 20\.')
    self.assertNotIn('Step 10/40', second.stderr)
    self.assertIn('Step 40/40', second.stderr)
    self.assertEqual(_Checkpoint(logdir, 40)[
        'global_step/.ATTRIBUTES/VARIABLE_VALUE'], 40)
    self.assertEqual(sorted(_Scalars(os.path.join(logdir, 'eval'))[
        'accuracy']), [20, 40])
    # Other processes and device splits: equal up to float reassociation.
    cli = _Checkpoint(logdir, 40)
    straight = _Checkpoint(self.straight_dir, 40)
    for key in straight:
      self.assertAllClose(cli[key], straight[key], atol=1e-5, msg=key)

  def testBadArguments(self):
    with self.assertRaisesRegex(ValueError, 'mode must be one of'):
      loop.train_and_evaluate(mlp.Tiny, self.root, mode='fit')
    with self.assertRaisesRegex(ValueError, 'max_steps must be a positive'):
      loop.train_and_evaluate(mlp.Tiny, self.root, max_steps=0)


class TrainerSplitsTheCpuTest(test_utils.FlagsParsedTestCase):
  """Without --num_logical_devices a CPU-only host gets the R x K devices the model needs."""

  def testATwoCellModelNeedsNoDeviceFlag(self):
    # The README's digits model has 2 cells, like TinyPipelined.
    digits = model_registry.GetParams('image.digits.AmoebaNetTiny')
    self.assertEqual(
        pipeline.PipeliningLayer.NumDevicesOf(digits.task.model), 2)
    # The trainer's split with its default flags, in this process (whose
    # TensorFlow has started: SplitCpu is recorded, not run). The binary
    # splits the CPU for real in testReplicasTimesCells, through this same
    # function with --num_replicas=2: a process (~10 s of CPU) fewer.
    self.assertEqual((FLAGS['num_logical_devices'].default,
                      FLAGS['num_replicas'].default), (0, 0))
    params = model_registry.GetParams('synthetic.mlp.TinyPipelined')
    names = lambda n: [f'/device:CPU:{i}' for i in range(n)]
    with flagsaver.flagsaver(num_logical_devices=0, num_replicas=0), \
        mock.patch.object(devices, 'SplitCpu', side_effect=names) as split, \
        self.assertLogs('absl', level='INFO') as logs:
      trainer._SplitCpu(params, multi_worker=False)  # pylint: disable=protected-access
    split.assert_called_once_with(2)
    self.assertIn('Split the CPU into 2 logical devices for 1 replicas x 2 '
                  'cells (set --num_logical_devices to choose)',
                  '\n'.join(logs.output))

  def testReplicasTimesCells(self):
    # With --graph_optimizer=off too (a process fewer): no Grappler pass
    # runs (their VLOG lines are asked for).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0',
               TF_CPP_VMODULE='meta_optimizer=1')
    run = subprocess.run(
        [sys.executable, '-m', 'gpipe_tf.trainer', '--mode=train',
         '--max_steps=1', f'--logdir={self.get_temp_dir()}/run',
         '--model=synthetic.mlp.TinyPipelined', '--num_replicas=2',
         '--graph_optimizer=off'],
        cwd=_REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
        check=False)
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    log = run.stderr
    self.assertIn('Done at global step 1', log)
    self.assertIn('Split the CPU into 4 logical devices for 2 replicas x 2 '
                  'cells', log)
    self.assertIn('MirroredStrategy: 2 replicas x 2 cells', log)
    self.assertIn('Replica 1: cell 0 on /device:CPU:2, cell 1 on '
                  '/device:CPU:3', log)
    self.assertIn('Graph optimizer off', log)
    # tf.data optimizes its own functions; the train step is not optimized.
    self.assertIn('grappler item: __inference_Dataset', log)
    self.assertFalse(re.search(r'grappler item: __inference_\w*TrainStep', log),
                     'Grappler optimized the train step')

  # A one-device model is not split: TrainLibTest.testCliTrainsThenResumes
  # (its second run has no device flags).


class TrainerCliTest(test_utils.FlagsParsedTestCase):
  """Bad input to the binary, through its main() in this process."""

  def _MainError(self, **flag_values):
    with flagsaver.flagsaver(**flag_values):
      with self.assertRaises(SystemExit) as cm:
        trainer.main(['trainer'])
    message = str(cm.exception.code)
    self.assertTrue(message.startswith('trainer: error: '), message)
    self.assertNotIn('\n', message)
    return message

  def testUnknownModelListsClosest(self):
    logdir = os.path.join(self.root, 'unknown_model')
    message = self._MainError(model='synthetic.mlp.Tinny', logdir=logdir)
    self.assertIn("'synthetic.mlp.Tinny'", message)
    self.assertIn('Closest registered names: synthetic.mlp.Tiny', message)
    self.assertFalse(os.path.exists(logdir))

  def testBadOverrides(self):
    logdir = os.path.join(self.root, 'bad_override')
    message = self._MainError(model='synthetic.mlp.Tiny', logdir=logdir,
                              model_params_override='modle.name : "x"')
    self.assertIn("'task.modle.name'", message)
    self.assertIn('Did you mean: task.model?', message)
    message = self._MainError(
        model='synthetic.mlp.Tiny', logdir=logdir,
        model_params_override='train.batch_size : 8; label_smoothing 0.1')
    self.assertIn("line 2: 'label_smoothing 0.1'", message)
    self.assertFalse(os.path.exists(logdir))

  def testIncompatibleLogdir(self):
    logdir = os.path.join(self.root, 'other_model')
    loop.train(mlp.Tiny, logdir, max_steps=1)
    before = _Snapshot(logdir)
    message = self._MainError(model='synthetic.mlp.Tiny', logdir=logdir,
                              model_params_override=WIDER, max_steps=2)
    self.assertRegex(message, r"'task/model/fc0/w'.*\[16, 32\].*\[16, 64\]")
    self.assertEqual(_Snapshot(logdir), before)

  def testFailedCheckpointWriteIsReportedAndTheLastGoodKept(self):
    logdir = os.path.join(self.root, 'disk_full')
    merge = functional_saver.gen_io_ops.merge_v2_checkpoints

    def _FullAtStep2(prefixes, prefix, **kwargs):
      if prefix.numpy().decode().endswith('ckpt-2'):
        raise tf.errors.ResourceExhaustedError(None, None,
                                               'No space left on device')
      return merge(prefixes, prefix, **kwargs)

    with mock.patch.object(functional_saver.gen_io_ops,
                           'merge_v2_checkpoints', _FullAtStep2):
      message = self._MainError(model='synthetic.mlp.Tiny', logdir=logdir,
                                mode='train', max_steps=3,
                                save_interval_steps=1)
    self.assertRegex(message, r'Writing checkpoint ckpt-2 in \S+ failed '
                     r'\(ResourceExhaustedError: No space left on device\)\. '
                     r'The newest good checkpoint is still \S+/ckpt-1;')
    ckpt_dir = os.path.join(logdir, 'ckpt')
    self.assertEndsWith(tf.train.latest_checkpoint(ckpt_dir), 'ckpt-1')
    self.assertFalse(os.path.exists(os.path.join(ckpt_dir, 'ckpt-2.index')))
    resumed = loop.train(mlp.Tiny, logdir, max_steps=3,
                              save_interval_steps=1)
    self.assertEqual(resumed.start_step, 1)
    self.assertEndsWith(resumed.restored_checkpoint, 'ckpt-1')

  def testClusterMistakesFailBeforeTensorFlowStarts(self):
    logdir = os.path.join(self.root, 'cluster')
    with mock.patch.dict(os.environ, {'TF_CONFIG': '{"cluster": '}):
      message = self._MainError(model='synthetic.mlp.Tiny', logdir=logdir)
    self.assertIn('TF_CONFIG is not valid JSON', message)
    two_workers = json.dumps({'cluster': {'worker': ['localhost:1',
                                                     'localhost:2']},
                              'task': {'type': 'worker', 'index': 0}})
    with mock.patch.dict(os.environ, {'TF_CONFIG': two_workers}):
      message = self._MainError(model='synthetic.mlp.Tiny', logdir=logdir,
                                num_replicas=2)
    self.assertIn('--num_replicas=2 splits one host; under a TF_CONFIG '
                  'cluster every task is one replica', message)
    self.assertFalse(os.path.exists(logdir))


if __name__ == '__main__':
  tf.test.main()
