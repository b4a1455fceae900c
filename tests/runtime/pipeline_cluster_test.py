"""Pipeline clusters on localhost: cells on worker servers compute what one process computes; a lost worker ends the trainer with one line, and a rerun resumes."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import atexit  # pylint: disable=g-import-not-at-top
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from unittest import mock

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from gpipe_tf import model_registry
from gpipe_tf import trainer as trainer_binary
from gpipe_tf.runtime import pipeline_cluster
from gpipe_tf.train import loop
from zygote import Zygote  # pylint: disable=g-bad-import-order

_REPO_ROOT = test_utils.REPO_ROOT
_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'pipeline_cluster_client.py')
MODEL = 'synthetic.mlp.TinyPipelined'  # K=2 cells, M=4, dropout.
START_TIMEOUT = 90        # Seconds for workers to serve / a first checkpoint.
RUN_TIMEOUT = 120         # Seconds for a whole client or trainer run.
FAILURE_BOUND = 60        # Seconds for the trainer to end after a failure.
WORKER_TIMEOUT = 6        # --worker_timeout_seconds of the trainers here.


def _Cluster(num_workers):
  ports = test_utils.FreePorts(num_workers + 1)
  return json.dumps({'chief': [f'localhost:{ports[0]}'],
                     'worker': [f'localhost:{p}' for p in ports[1:]]})


def _Env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def ReadFile(path):
  with open(path, errors='replace') as f:
    return f.read()


def AssertOneErrorLine(test, output, pattern):
  """A trainer's stderr `output` holds one 'trainer: error:' line, its
  last, matching `pattern`."""
  lines = [l for l in output.splitlines() if l.startswith('trainer: error:')]
  test.assertLen(lines, 1, output[-3000:])
  test.assertEqual(output.strip().splitlines()[-1], lines[0])
  test.assertRegex(lines[0], pattern)


# The chief of both client scripts in one process (a second costs a
# TensorFlow import): connected once, it runs pipeline_cluster_client's main,
# then pipeline_cluster_replicas_client's (whose connect is then a no-op),
# then the trainer's entry point for pipeline_cluster_replicas_test
# (TRAINERS) through entry_point.RunCapturingStderr: a trainer process is
# this script's connected chief plus flag parsing; its os._exit(1) raises
# SystemExit here. Each trainer's stderr (absl log and error line) goes to
# <replicas dir>/<name>.log, the exit statuses to <replicas dir>/trainers.json.
_CHIEF = """
import json, os, sys
from unittest import mock
import entry_point
from gpipe_tf import trainer
from gpipe_tf.runtime import pipeline_cluster
import pipeline_cluster_client
import pipeline_cluster_replicas_client
cluster, cells_dir, replicas_dir, trainers = sys.argv[1:]
pipeline_cluster.ConnectToCluster(pipeline_cluster.ParseCluster(cluster), 60)
pipeline_cluster.ConnectToCluster = lambda *args, **kwargs: None
pipeline_cluster_client.main(cluster, cells_dir)
pipeline_cluster_replicas_client.main(cluster, replicas_dir)

def Exit(code):
  raise SystemExit(code)

def RunTrainer(name, args):
  with mock.patch.object(os, '_exit', side_effect=Exit):
    code, stderr = entry_point.RunCapturingStderr(trainer.main, [
        'trainer', f'--pipeline_cluster={cluster}',
        f'--logdir={os.path.join(replicas_dir, name)}', *args])
  with open(os.path.join(replicas_dir, name + '.log'), 'w') as log:
    log.write(stderr)
  return code

codes = {name: RunTrainer(name, args)
         for name, args in json.loads(trainers).items()}
with open(os.path.join(replicas_dir, 'trainers.json'), 'w') as f:
  json.dump(codes, f)
"""
_chief_dirs = None


def TrainerFlags(max_steps, *extra):
  """The flags of a trainer on a pipeline cluster, but --pipeline_cluster and
  --logdir."""
  return [f'--model={MODEL}', '--mode=train', f'--max_steps={max_steps}',
          '--save_interval_steps=2', '--log_interval_steps=2',
          f'--worker_timeout_seconds={WORKER_TIMEOUT}', *extra]


# No dropout: masks differ by split.
REPLICAS_OVERRIDE = 'model.layers[1].keep_prob : 1.0'
REPLICAS_TRAINER_STEPS = 2  # One logging and saving interval.
# The trainer runs of pipeline_cluster_replicas_test, in the chief: name ->
# flags (see TrainerFlags).
TRAINERS = {
    # 2 replicas x 2 cells of TinyPipelined.
    'trainer': TrainerFlags(REPLICAS_TRAINER_STEPS, '--num_replicas=2',
                            f'--model_params_override={REPLICAS_OVERRIDE}'),
    # 3 x 2 cells do not fit on 2 workers of 2 devices.
    'trainer_3': TrainerFlags(2, '--num_replicas=3'),
}


def ClientOutputs(test):
  """{'cells': OUT_DIR of pipeline_cluster_client, 'replicas': of
  pipeline_cluster_replicas_client and of the TRAINERS}, all run once on the
  shared workers (SharedWorkers) by one chief process; fails `test` with the
  end of its log if it does not exit 0."""
  global _chief_dirs
  if _chief_dirs is None:
    workers = SharedWorkers(test)
    root = test.get_temp_dir()
    dirs = {'cells': os.path.join(root, 'cells'),
            'replicas': os.path.join(root, 'replicas')}
    for d in dirs.values():
      os.makedirs(d, exist_ok=True)
    log = os.path.join(root, 'chief.log')
    open(log, 'w').close()
    chief = workers.zygote.Start(
        [sys.executable, '-c', _CHIEF, workers.cluster, dirs['cells'],
         dirs['replicas'], json.dumps(TRAINERS)],
        dict(_Env(), PYTHONPATH=os.pathsep.join(
            [test_utils.CHILD_PYTHONPATH, os.path.dirname(_CLIENT)])), log)
    try:
      code = chief.wait(3 * RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
      chief.kill()
      chief.wait()
      raise
    test.assertEqual(code, 0, ReadFile(log)[-3000:])
    _chief_dirs = dirs
  return _chief_dirs


class _Workers:
  """serve_worker processes of one cluster, forked by `zygote` (which forks
  the processes that use them too), killed at the test's cleanup (or, with
  kill_at_cleanup=False, by whoever shares them)."""

  def __init__(self, test, cluster, zygote, num_logical_devices=1,
               kill_at_cleanup=True):
    self.test = test  # Logs go to its temporary directory; it asserts.
    self.cluster = cluster
    self.zygote = zygote
    self.num_logical_devices = num_logical_devices
    count = len(json.loads(cluster)['worker'])
    self.processes = [None] * count
    self.logs = [None] * count
    if kill_at_cleanup:
      test.addCleanup(self.KillAll)
    for i in range(count):
      self.Start(i)
    self.WaitServing(range(count))

  def Start(self, index):
    self.logs[index] = os.path.join(self.test.get_temp_dir(),
                                    f'worker{index}.{time.time()}.log')
    open(self.logs[index], 'w').close()
    self.processes[index] = self.zygote.Start(
        [sys.executable, '-m', 'gpipe_tf.runtime.serve_worker',
         f'--cluster={self.cluster}', f'--task_index={index}',
         f'--num_logical_devices={self.num_logical_devices}'],
        _Env(), self.logs[index])

  def WaitServing(self, indices):
    deadline = time.time() + START_TIMEOUT
    for i in indices:
      while 'is serving devices' not in ReadFile(self.logs[i]):
        self.test.assertIsNone(self.processes[i].poll(), ReadFile(self.logs[i]))
        self.test.assertLess(time.time(), deadline, ReadFile(self.logs[i]))
        time.sleep(0.1)

  def KillAll(self):
    for process in self.processes:
      if process is not None and process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


class _Trainer:
  """One trainer process on the cluster of `workers` (forked by their
  zygote), killed at cleanup."""

  def __init__(self, test, workers, logdir, max_steps, *extra):
    self.log = os.path.join(test.get_temp_dir(), f'trainer.{time.time()}.log')
    open(self.log, 'w').close()
    self.process = workers.zygote.Start(
        [sys.executable, '-m', 'gpipe_tf.trainer',
         f'--pipeline_cluster={workers.cluster}', f'--logdir={logdir}',
         *TrainerFlags(max_steps, *extra)], _Env(), self.log)
    test.addCleanup(self.Kill)

  def Kill(self):
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()

  def Wait(self, timeout):
    """The exit code, or None if the trainer is still running after timeout."""
    try:
      return self.process.wait(timeout)
    except subprocess.TimeoutExpired:
      return None

  def Output(self):
    return ReadFile(self.log)


def _NewestStep(logdir):
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'ckpt'))
  return int(path.rsplit('-', 1)[1]) if path else None


class ParseAndLayoutTest(tf.test.TestCase):
  """The pure parts: parsing, cell layout, naming the failed worker (its
  health checks and messages: worker_health_test.py)."""

  CLUSTER = {'chief': ['trainer:2222'], 'worker': ['h0:2222', 'h1:2223']}

  def testParsesJsonFileAndTfConfig(self):
    want = pipeline_cluster.PipelineCluster('trainer:2222',
                                            ('h0:2222', 'h1:2223'))
    text = json.dumps(self.CLUSTER)
    self.assertEqual(pipeline_cluster.ParseCluster(text), want)
    path = os.path.join(self.get_temp_dir(), 'cluster.json')
    with open(path, 'w') as f:
      f.write(text)
    self.assertEqual(pipeline_cluster.ParseCluster(path), want)
    tf_config = json.dumps({'cluster': self.CLUSTER,
                            'task': {'type': 'chief', 'index': 0}})
    self.assertEqual(pipeline_cluster.ParseCluster(
        'TF_CONFIG', {'TF_CONFIG': tf_config}), want)
    self.assertEqual(pipeline_cluster.ParseCluster(want.AsJson()), want)

  def testBadClustersSayWhatToWrite(self):
    bad = {
        '{"worker": ["h:1"]}': 'exactly one "chief"',
        '{"chief": ["t:1"]}': 'non-empty "worker"',
        '{"chief": ["t:1"], "worker": ["h"]}': 'not a host:port',
        '{"chief": ["t:1"], "worker": ["h:1"], "ps": ["p:1"]}':
            'only "chief"',
        '{"chief": ["t:1"], "worker": [': 'not valid JSON',
        '/no/such/file.json': 'neither JSON nor an existing file',
    }
    for text, message in bad.items():
      with self.assertRaisesRegex(pipeline_cluster.PipelineClusterError,
                                  re.escape(message)):
        pipeline_cluster.ParseCluster(text)
    with self.assertRaisesRegex(pipeline_cluster.PipelineClusterError,
                                'TF_CONFIG is empty'):
      pipeline_cluster.ParseCluster('TF_CONFIG', {})

  def testAssignCellsInContiguousBlocks(self):
    tasks = [[f't{t}d{d}' for d in range(3)] for t in range(2)]
    self.assertEqual(pipeline_cluster.AssignCells(1, tasks), ['t0d0'])
    self.assertEqual(pipeline_cluster.AssignCells(2, tasks), ['t0d0', 't1d0'])
    self.assertEqual(pipeline_cluster.AssignCells(5, tasks),
                     ['t0d0', 't0d1', 't0d2', 't1d0', 't1d1'])
    with self.assertRaisesRegex(pipeline_cluster.PipelineClusterError,
                                'num_logical_devices=4'):
      pipeline_cluster.AssignCells(7, tasks)

  def testWorkerDevicesPreferGpusAndSkipTheChief(self):
    cluster = pipeline_cluster.ParseCluster(json.dumps(self.CLUSTER))
    names = ['/job:chief/replica:0/task:0/device:CPU:0'] + [
        f'/job:worker/replica:0/task:{t}/device:{kind}:{d}'
        for t in (1, 0) for kind in ('CPU', 'GPU') for d in (1, 0)
        if not (t == 1 and kind == 'GPU')]
    self.assertEqual(pipeline_cluster.WorkerDevices(cluster, names), [
        ['/job:worker/replica:0/task:0/device:GPU:0',
         '/job:worker/replica:0/task:0/device:GPU:1'],
        ['/job:worker/replica:0/task:1/device:CPU:0',
         '/job:worker/replica:0/task:1/device:CPU:1']])
    self.assertEqual(pipeline_cluster.PipelineDevices(3, cluster, names), [
        '/job:worker/replica:0/task:0/device:GPU:0',
        '/job:worker/replica:0/task:0/device:GPU:1',
        '/job:worker/replica:0/task:1/device:CPU:0'])

  def testWorkerNamedInAnError(self):
    cluster = pipeline_cluster.ParseCluster(json.dumps(self.CLUSTER))
    by_task = tf.errors.UnavailableError(
        None, None, 'Graph execution error:\n\nrecvmsg:Connection reset by '
        'peer\nAdditional GRPC error information from remote target '
        '/job:worker/replica:0/task:1/device:CPU:0 while calling x')
    by_address = tf.errors.UnavailableError(
        None, None, 'failed to connect to all addresses; h1:2223: refused')
    self.assertEqual(pipeline_cluster.WorkerNamedIn(cluster, by_task), 1)
    self.assertEqual(pipeline_cluster.WorkerNamedIn(cluster, by_address), 1)
    self.assertIsNone(pipeline_cluster.WorkerNamedIn(
        cluster, tf.errors.UnavailableError(None, None, 'socket closed')))


# One start of 2 worker servers x 2 CPU devices (each start costs a TensorFlow
# import a process) serves RemoteCellsTest, WorkerFailureTest and
# pipeline_cluster_replicas_test's ReplicasOnWorkersTest: one xdist worker
# runs the three classes (GROUP). The trainers' K=2 cells of TinyPipelined
# still go one per worker (AssignCells spreads K over the workers first).
GROUP = 'pipeline_cluster_workers'
_shared_workers = None


def SharedWorkers(test):
  """The 2 shared workers, serving; any that is not running (re)started.

  Killed at this module's teardown, or at exit if this module's tests do not
  run (the replicas test alone).
  """
  global _shared_workers
  if _shared_workers is None:
    _shared_workers = _Workers(test, _Cluster(2), Zygote(),
                               num_logical_devices=2, kill_at_cleanup=False)
    atexit.register(_EndSharedWorkers)
    return _shared_workers
  workers = _shared_workers
  workers.test = test
  ended = [i for i, p in enumerate(workers.processes) if p.poll() is not None]
  for i in ended:
    workers.Start(i)
  workers.WaitServing(ended)
  return workers


def _EndSharedWorkers():
  """Kills the shared workers and waits for their zygote (its CPU counts)."""
  global _shared_workers
  if _shared_workers is not None:
    _shared_workers.KillAll()
    _shared_workers.zygote.Close()
    _shared_workers = None


def tearDownModule():  # pylint: disable=invalid-name
  _EndSharedWorkers()


@pytest.mark.xdist_group(GROUP)
class RemoteCellsTest(tf.test.TestCase):
  """2 worker servers x 2 CPU devices; the chief is a client subprocess."""

  def testGradientsEqualOneProcessAndOpsRunOnWorkers(self):
    out_dir = ClientOutputs(self)['cells']
    got = np.load(os.path.join(out_dir, 'results.npz'))
    with open(os.path.join(out_dir, 'placement.json')) as f:
      placement = json.load(f)

    spec = importlib.util.spec_from_file_location('client', _CLIENT)
    client_lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client_lib)
    # The same model in this process, unpipelined, on no cluster.
    sequential = client_lib.Model(None)
    loss, grads = client_lib.LossAndGrads(sequential)
    self.assertLen(grads, 8)
    for k, m in client_lib.CONFIGS:
      config = f'K{k}M{m}'
      self.assertAllClose(got[f'{config}/loss'], loss, rtol=0, atol=1e-5)
      for name, g in grads.items():
        self.assertAllClose(got[f'{config}/{name}'], g, rtol=0, atol=1e-5,
                            msg=f'{config} {name}')
      # Cells in contiguous blocks over the workers' devices, and the
      # variables and their gradients really live there.
      blocks = [k // 2 + (t < k % 2) for t in range(2)]
      want = [f'/job:worker/replica:0/task:{t}/device:CPU:{d}'
              for t in range(2) for d in range(blocks[t])]
      self.assertEqual(placement[config]['cells'], want)
      for what in ('variables', 'gradients'):
        devices = placement[config][what]
        self.assertEqual(sorted(devices), sorted(grads))
        self.assertTrue(all(re.fullmatch(
            r'/job:worker/replica:0/task:\d/device:CPU:\d', d)
                            for d in devices.values()), devices)
        self.assertEqual(sorted(set(devices.values())), sorted(want))

    # The chief wrote the workers' variables in the usual format: this
    # process restores them into its unpipelined model.
    before = [v.numpy() for v in sequential.trainable_variables]
    tf.train.Checkpoint(model=sequential).read(
        os.path.join(out_dir, 'ckpt')).assert_existing_objects_matched()
    for v, old in zip(sequential.trainable_variables, before):
      self.assertAllClose(v.numpy(), old + 1.0, rtol=0, atol=1e-6)


@pytest.mark.xdist_group(GROUP)
class WorkerFailureTest(tf.test.TestCase):
  """The trainer on 2 workers: kill -9, SIGSTOP, no worker at all.

  The tests share the 2 worker servers (SharedWorkers, with RemoteCellsTest
  and the replicas test): a test gets them all serving, a worker it killed
  or stopped restarted first. A trainer of one test never meets another's:
  each ends (or is killed) before its test does.
  """

  def _SignalWorkerAfterCheckpoint(self, workers, index, sig, trainer,
                                   logdir, step):
    """Signals worker `index` once `trainer` has a checkpoint of `step` or
    later.

    Returns the seconds from the signal until the trainer exited with status 1.
    """
    deadline = time.time() + START_TIMEOUT
    while (_NewestStep(logdir) or 0) < step:
      self.assertIsNone(trainer.process.poll(), trainer.Output()[-3000:])
      self.assertLess(time.time(), deadline, trainer.Output()[-3000:])
      time.sleep(0.05)
    # Whatever the signal, this process ends with the test (the next test
    # restarts the worker).
    self.addCleanup(self._End, workers.processes[index])
    workers.processes[index].send_signal(sig)
    signalled_at = time.time()
    code = trainer.Wait(FAILURE_BOUND)
    took = time.time() - signalled_at
    self.assertEqual(code, 1, trainer.Output()[-3000:])  # None: still running.
    return took

  @staticmethod
  def _End(process):
    if process.poll() is None:
      process.send_signal(signal.SIGCONT)
      process.kill()
      process.wait()

  def testKilledWorkerEndsTrainerRerunResumesStoppedWorkerTimesOut(self):
    # One trainer command run twice (each run costs a TensorFlow import): the
    # first run loses worker 1 to kill -9; the rerun resumes, trains one
    # saving interval like one process, then loses worker 0 to SIGSTOP. Every
    # checkpoint is kept: the rerun may save more before worker 0 stops.
    workers = SharedWorkers(self)
    logdir = os.path.join(self.get_temp_dir(), 'run')
    command = (workers, logdir, 100000, '--max_checkpoints_to_keep=1000')
    trainer = _Trainer(self, *command)
    took = self._SignalWorkerAfterCheckpoint(workers, 1, signal.SIGKILL,
                                             trainer, logdir, 1)
    self.assertLess(took, FAILURE_BOUND)
    AssertOneErrorLine(
        self, trainer.Output(),
        r'^trainer: error: pipeline worker 1 \(/job:worker/replica:0/'
        r'task:1 at localhost:\d+\) .*serve_worker .*--task_index=1.*rerun '
        r'this trainer command; training resumes from the newest checkpoint '
        r'\(\S+ckpt-\d+\)\.$')

    # Restart the worker, rerun the same command: it resumes. Once it has
    # trained one logging and saving interval, stop worker 0: the health
    # check ends the rerun (its timeout plus at most one interval).
    newest = _NewestStep(logdir)
    workers.Start(1)
    workers.WaitServing([1])
    final = newest + 2
    rerun = _Trainer(self, *command)
    took = self._SignalWorkerAfterCheckpoint(workers, 0, signal.SIGSTOP,
                                             rerun, logdir, final)
    self.assertLess(took, WORKER_TIMEOUT + 2 + 10)
    AssertOneErrorLine(
        self, rerun.Output(),
        r'^trainer: error: pipeline worker 0 .* did not answer a '
        rf'health check within {WORKER_TIMEOUT} s \(stopped, overloaded or cut '
        r'off\?\)\. .*--task_index=0')
    self.assertRegex(rerun.Output(), rf'Resuming from \S*ckpt-{newest} at '
                     rf'global step {newest}\.')
    self.assertIn('Pipeline cluster: cell 1 on /job:worker/replica:0/task:1/'
                  'device:CPU:0', rerun.Output())

    # ckpt-<final> is that of one process training without interruption
    # (same weights, batches and dropout masks; cells on local devices).
    got = test_utils.CheckpointValues(logdir, final)
    params = model_registry.GetParams(MODEL)
    one_process = os.path.join(self.get_temp_dir(), 'one_process')
    loop.train(params, one_process, final, save_interval_steps=final,
               num_replicas=1)
    want = test_utils.CheckpointValues(one_process, final)
    self.assertEqual(sorted(got), sorted(want))
    for key in got:
      self.assertAllClose(got[key], want[key], rtol=0, atol=1e-5, msg=key)
    # And one process resumes from the cluster's newest checkpoint.
    copy = os.path.join(self.get_temp_dir(), 'copy')
    shutil.copytree(logdir, copy)
    last = _NewestStep(copy)
    result = loop.train(params, copy, last + 1, save_interval_steps=1,
                        num_replicas=1)
    self.assertEqual(result.start_step, last)
    self.assertTrue(result.restored_checkpoint.endswith(f'ckpt-{last}'))

  def testMissingWorkerFailsAtStart(self):
    # The trainer's main() in this process (a subprocess costs a TensorFlow
    # import): with no worker serving it fails in WaitForWorkers, before it
    # connects, so this process stays unconnected. Its os._exit(1) raises
    # SystemExit here instead; its stderr is read from a StringIO. The one
    # line of a trainer process: the test above.
    cluster = _Cluster(2)
    logdir = os.path.join(self.get_temp_dir(), 'run')
    test_utils.MarkFlagsParsed()
    stderr = io.StringIO()
    started = time.time()
    with flagsaver.flagsaver(
        model=MODEL, logdir=logdir, mode='train', max_steps=10,
        save_interval_steps=2, log_interval_steps=2,
        pipeline_cluster=cluster, worker_timeout_seconds=WORKER_TIMEOUT), \
        mock.patch.object(sys, 'stderr', stderr), \
        mock.patch.object(os, '_exit', side_effect=SystemExit) as exit_:
      with self.assertRaises(SystemExit):
        trainer_binary.main(['trainer'])
    exit_.assert_called_once_with(1)
    self.assertLess(time.time() - started, RUN_TIMEOUT)
    AssertOneErrorLine(
        self, stderr.getvalue(),
        r'^trainer: error: worker 0 \(.*\) cannot be reached at '
        r'localhost:\d+ \(.*Connection refused\); worker 1 \(.*\) cannot be '
        r'reached .*\(waited '
        rf'{WORKER_TIMEOUT} s\)\. Start each on its host \(python -m '
        r'gpipe_tf.runtime.serve_worker .*--task_index=0; .*--task_index=1\)')
    self.assertFalse(os.path.exists(logdir))

if __name__ == '__main__':
  tf.test.main()
