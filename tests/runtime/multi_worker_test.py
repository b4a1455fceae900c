"""Several hosts, on localhost: 2 trainer tasks x 2 cells train like one process and restart exactly after a kill."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import glob  # pylint: disable=g-import-not-at-top
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf.train import checkpoints
from gpipe_tf import model_registry
from gpipe_tf.train import loop
from zygote import Zygote  # pylint: disable=g-bad-import-order

_REPO_ROOT = test_utils.REPO_ROOT
MODEL = 'synthetic.mlp.TinyPipelined'  # K=2 cells, M=4 micro-batches.
# Without dropout, 2 replicas on half batches equal one device on the whole.
OVERRIDE = 'model.layers[1].keep_prob : 1.0'
NUM_TASKS = 2
STEPS_AFTER_RESTART = 2  # One logging and saving interval.
START_TIMEOUT = 120    # Seconds for a job to train its first checkpoint.
JOB_TIMEOUT = 180      # Seconds for a whole job.
PEER_FAILURE_BOUND = 60  # Seconds for a survivor to fail after a peer dies.


def _NewestStep(logdir):
  """The step of the checkpoint the chief's state file names, or None."""
  state = os.path.join(logdir, 'ckpt', 'checkpoint')
  if not os.path.exists(state):
    return None
  with open(state) as f:
    match = re.search(r'model_checkpoint_path: "ckpt-(\d+)"', f.read())
  return int(match.group(1)) if match else None


class _Job:
  """NUM_TASKS trainer processes of one multi-worker job on localhost."""

  def __init__(self, test, zygote, logdir, max_steps):
    self.logdir = logdir
    self.logs = []
    self.processes = []
    addresses = [f'localhost:{p}' for p in test_utils.FreePorts(NUM_TASKS)]
    for index in range(NUM_TASKS):
      config = {'cluster': {'worker': addresses},
                'task': {'type': 'worker', 'index': index}}
      env = dict(os.environ, TF_CONFIG=json.dumps(config),
                 TF_CPP_MIN_LOG_LEVEL='2')
      log = tempfile.NamedTemporaryFile(
          'w+', dir=test.get_temp_dir(), suffix=f'.task{index}.log',
          delete=False)
      self.logs.append(log)
      self.processes.append(zygote.Start(
          [sys.executable, '-m', 'gpipe_tf.trainer', f'--model={MODEL}',
           f'--logdir={logdir}', '--mode=train', f'--max_steps={max_steps}',
           '--num_logical_devices=2', f'--model_params_override={OVERRIDE}',
           '--save_interval_steps=2', '--log_interval_steps=2',
           '--collective_timeout_seconds=60'], env, log.name))
    test.addCleanup(self.Kill)

  def Kill(self):
    for process in self.processes:
      if process.poll() is None:
        process.kill()
        process.wait()
    for log in self.logs:
      log.close()

  def Wait(self, timeout):
    """Return codes of all tasks, waiting at most `timeout` seconds in all."""
    deadline = time.time() + timeout
    codes = []
    for process in self.processes:
      try:
        codes.append(process.wait(max(deadline - time.time(), 0.1)))
      except subprocess.TimeoutExpired:
        self.Kill()
        raise AssertionError(f'Job in {self.logdir} still running after '
                             f'{timeout} s:\n{self.Tail()}') from None
    return codes

  def Log(self, index):
    with open(self.logs[index].name) as f:
      return f.read()

  def Tail(self):
    return '\n'.join(f'--- task {i} ---\n' + self.Log(i)[-2500:]
                     for i in range(NUM_TASKS))


class MultiWorkerTest(tf.test.TestCase):
  """A job killed and restarted, against uninterrupted runs in this process."""

  def _CheckLayout(self, job, final):
    for index in range(NUM_TASKS):
      log = job.Log(index)
      self.assertIn('Strategy MultiWorkerMirroredStrategy: 2 replicas x 2 '
                    'cells per replica.', log)
      for replica in range(NUM_TASKS):
        cells = ', '.join(
            f'cell {k} on /job:worker/replica:0/task:{replica}/device:CPU:{k}'
            for k in range(2))
        self.assertIn(f'Replica {replica}: {cells}', log)
      # What the pipeline actually used when its step was traced.
      own = ', '.join(f'/job:worker/replica:0/task:{index}/device:CPU:{k}'
                      for k in range(2))
      self.assertIn(f'Replica {index} (task worker:{index}) pipelines on '
                    f'{own}', log)
      self.assertIn(f'Done at global step {final}', log)
    self.assertIn('This is task worker:0 (chief', job.Log(0))
    self.assertNotIn('(chief', job.Log(1))

  def _InProcessRun(self, max_steps, num_replicas):
    """An uninterrupted run of the same global batches, in this process."""
    params = model_registry.GetParams(MODEL)
    base_experiment.ApplyOverrides(params, OVERRIDE)
    logdir = os.path.join(self.get_temp_dir(), f'one_process_{num_replicas}')
    loop.train(params, logdir, max_steps, save_interval_steps=max_steps,
                    num_replicas=num_replicas)
    return test_utils.CheckpointValues(logdir, max_steps)

  def testKilledTaskRestartsAndTrainsLikeOneProcess(self):
    # 1. Kill task 1 of a job as soon as the chief has saved a checkpoint.
    logdir = os.path.join(self.get_temp_dir(), 'job')
    zygote = Zygote(self)
    job = _Job(self, zygote, logdir, 100000)
    deadline = time.time() + START_TIMEOUT
    while _NewestStep(logdir) is None:
      self.assertLess(time.time(), deadline, job.Tail())
      self.assertIsNone(job.processes[0].poll(), job.Tail())
      time.sleep(0.05)
    job.processes[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    try:
      code = job.processes[0].wait(PEER_FAILURE_BOUND)
    except subprocess.TimeoutExpired:
      self.fail(f'Task 0 still running {PEER_FAILURE_BOUND} s after task 1 '
                f'was killed:\n{job.Tail()}')
    self.assertLess(time.time() - killed_at, PEER_FAILURE_BOUND)
    self.assertEqual(code, 1, job.Tail())
    self.assertRegex(job.Log(0), r'trainer: error: task worker:0: another task '
                     r'of the job failed .*restart every task')
    job.Kill()
    newest = _NewestStep(logdir)
    checkpoints.VerifyReadable(os.path.join(logdir, 'ckpt', f'ckpt-{newest}'))

    # 2. Restart every task with the same command.
    final = newest + STEPS_AFTER_RESTART
    restarted = _Job(self, zygote, logdir, final)
    self.assertEqual(restarted.Wait(JOB_TIMEOUT), [0] * NUM_TASKS,
                     restarted.Tail())
    for index in range(NUM_TASKS):
      log = restarted.Log(index)
      self.assertRegex(log, rf'Resuming from \S*ckpt-{newest} at global step '
                       rf'{newest}\.')
      # No step lost or repeated: logging resumes right after the checkpoint.
      logged = [int(s) for s in re.findall(rf'Step (\d+)/{final}:', log)]
      self.assertEqual(logged, list(range(newest + 2, final + 1, 2)), log)
    self._CheckLayout(restarted, final)
    # Only the chiefs wrote: one event file per chief run, no scratch left.
    self.assertEqual(sorted(os.listdir(logdir)),
                     ['ckpt', 'params.txt', 'train'])
    self.assertLen(glob.glob(os.path.join(logdir, 'train', 'events.*')), 2)

    # 3. Equal to an uninterrupted run of 2 replicas x 2 cells on one host
    # (same shares of the same global batches). Until the action executor
    # (0.2) this was bit-identical; since then the values differ in the last
    # bits (measured: up to 5e-5 relative on weights near 1e-4) for a reason not
    # yet found (docs/distributed.md).
    got = test_utils.CheckpointValues(logdir, final)
    self.assertEqual(got['global_step/.ATTRIBUTES/VARIABLE_VALUE'], final)
    uninterrupted = self._InProcessRun(final, num_replicas=2)
    self.assertEqual(sorted(got), sorted(uninterrupted))
    self.assertGreater(len(got), 6)  # Weights, Adam slots, step counters.
    for key in got:
      self.assertAllClose(got[key], uninterrupted[key], rtol=1e-4, atol=1e-8,
                          msg=key)

    # 4. Equal, up to float reassociation, to one device (K=2 cells, no
    # strategy) training on the whole global batches.
    one = self._InProcessRun(final, num_replicas=1)
    self.assertEqual(sorted(got), sorted(one))
    for key in got:
      self.assertAllClose(got[key], one[key], rtol=1e-4, atol=1e-5, msg=key)


if __name__ == '__main__':
  tf.test.main()
