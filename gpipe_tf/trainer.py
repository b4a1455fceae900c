"""The trainer binary: absl flags over loop.train_and_evaluate.

Usage (from the repository root, so that the ``params`` package imports)::

  python -m gpipe_tf.trainer --model=synthetic.mlp.Tiny --logdir=/tmp/tiny \\
      --max_steps=200 [--mode=train_and_eval] \\
      [--model_params_override='learning_rate_schedule.learning_rate : 0.003;
                                train.batch_size : 64']

Running it again with a larger --max_steps resumes from the newest checkpoint.

On a host without GPU or TPU the CPU is split into the R x K logical devices
the model needs (K: its PipeliningLayer cells, R: --num_replicas, 1 if 0),
before TensorFlow runs any op, and the log says so; --num_logical_devices=N
chooses N instead (1: no split).

--num_replicas=R trains R data-parallel copies of the pipeline (R x K devices,
e.g. --num_replicas=2 for TinyPipelined's K=2 splits the CPU into 4); the
default, 0, uses every device (R = devices // K);
when TF_CONFIG names a cluster of several 'chief'/'worker' tasks, every task
runs this same command and is one replica on its own K devices
(MultiWorkerMirroredStrategy; only the chief writes into --logdir, which all
tasks must see at the same path; see docs/distributed.md);
--deterministic makes reruns bit-identical; --on_nonfinite=skip|stop says
what a NaN/Inf step does (its update is never applied).

--pipeline_cluster='{"chief": ["this_host:port"], "worker": [...]}' (or a
file holding that JSON, or TF_CONFIG) runs the pipeline's K cells on other
hosts: each worker host runs ``python -m gpipe_tf.runtime.serve_worker``
with the same cluster, this trainer connects to them before any op and sets
the model's PipeliningLayer ``devices`` to the workers' devices
(gpipe_tf.runtime.pipeline_cluster; docs/cross-host.md). With
--num_replicas=R > 1 it lays R x K cells over the workers (each replica's K
cells in one contiguous block) and drives the R replicas in-graph under a
MirroredStrategy over their first devices, whose gradient sums run on
replica 0's first device (no collective ops); --num_replicas=0 means 1 here,
and TF_CONFIG multi-worker training tasks are not combined with it. A
worker that dies or stops answering for --worker_timeout_seconds ends the
run with a one-line error naming it; restart it and rerun the same command,
training resumes from the newest checkpoint.

--precision=mixed_bfloat16|mixed_float16 trains with float32 variables and
16-bit math and activations (mixed_float16 with a dynamic loss scale).

--profile_steps=A,B profiles the training steps A to B with the TensorFlow
profiler into logdir/train/plugins/profile (TensorBoard's Profile tab). The
progress lines end with an ETA: the last interval's step time times the
steps left.

--model_params_override takes the ToText format ('path : value' statements
separated by newlines or ';'). Paths starting with ``train.``, ``test.`` or
``task.`` are taken as written in logdir/params.txt; any other path is
relative to the task Params (``base_experiment.ApplyOverrides``).

Any named error of the library (``gpipe_tf.errors.Error``: an unknown
--model, an unknown override path, a malformed override, a partition that
does not fit, a logdir holding another model, a missing warm-start
checkpoint, a checkpoint that cannot be written, ...) exits with status 1 and
one line on stderr::

  trainer: error: <ErrorClass>: <what is wrong and what to change>

with its traceback before it only under --debug. The model, override and
cluster errors are detected before the logdir is touched. A checkpoint that
cannot be written names the newest good one, which is kept. In a
multi-worker job, a task that lost a peer also exits with one line:
MultiWorkerMirroredStrategy is not elastic, so restart every task with the
same command; they resume from the newest checkpoint.

The flags are defined here only; the library takes Params and arguments.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import threading
from typing import NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging

from gpipe_tf import base_experiment
from gpipe_tf import errors
from gpipe_tf import model_registry

__all__ = ['FlagError', 'main']

FLAGS = flags.FLAGS

flags.DEFINE_string('model', None,
                    'Registered experiment, e.g. synthetic.mlp.Tiny.')
flags.DEFINE_string('logdir', None,
                    'Directory of checkpoints, summaries and params.txt.')
flags.DEFINE_enum('mode', 'train_and_eval', ['train', 'eval', 'train_and_eval'],
                  'train: train to --max_steps; eval: evaluate the newest '
                  'checkpoint once; train_and_eval: train, then evaluate.')
flags.DEFINE_integer('max_steps', 1000, 'Global step to train to.')
flags.DEFINE_string('model_params_override', '',
                    "Overrides in ToText format ('path : value', separated by "
                    "newlines or ';'); paths are relative to the task Params "
                    'unless they start with train., test. or task.')
flags.DEFINE_integer('num_logical_devices', 0,
                     'Without GPU/TPU, split the CPU into this many logical '
                     'devices (before any TensorFlow op); 1: no split. 0 '
                     '(default): automatic, R x K for the model (K: its '
                     'pipeline cells, R: --num_replicas, 1 if 0).')
flags.DEFINE_integer('save_interval_steps', 100, 'Checkpoint every N steps.')
flags.DEFINE_integer('log_interval_steps', 10,
                     'Log and write train summaries every N steps.')
flags.DEFINE_integer('eval_interval_steps', 0,
                     'With train_and_eval, also evaluate every N steps; 0: '
                     'only at the end.')
flags.DEFINE_integer('eval_steps', 0,
                     'Evaluate on at most N batches; 0: the whole Test() set.')
flags.DEFINE_integer('max_checkpoints_to_keep', 5,
                     'How many recent checkpoints to keep.')
flags.DEFINE_enum('on_nonfinite', 'skip', ['skip', 'stop'],
                  'A step whose loss or gradients are NaN/Inf never updates '
                  'the weights or optimizer slots. skip: go on (the global '
                  'step still advances; summary skipped_steps counts them); '
                  'stop: exit with an error before saving.')
flags.DEFINE_bool('deterministic', False,
                  'Enable TensorFlow op determinism and seed the global '
                  'generators with the task random_seed before building, so '
                  'reruns are bit-identical. Cost measured on a 2-core CPU '
                  '(300 steps, interleaved runs): synthetic.mlp.Tiny none '
                  'within noise; synthetic.mlp.TinyPipelined (2 cells, 4 '
                  'micro-batches) median 352 vs 459 steps/s (-23%). On GPUs '
                  'deterministic kernels can be markedly slower, and ops '
                  'without a deterministic kernel raise an error.')
flags.DEFINE_float('collective_timeout_seconds', 300.0,
                   'Multi-worker (TF_CONFIG) only: a collective op (gradient '
                   'all-reduce) waiting longer than this for the other tasks '
                   'fails with DeadlineExceededError instead of hanging; 0: '
                   'no timeout. A dead task is usually detected sooner (~10 '
                   's) by TensorFlow\'s heartbeats.')
flags.DEFINE_integer('num_replicas', 0,
                     'R: data-parallel replicas of the model on this host '
                     '(MirroredStrategy); each replica pipelines its share '
                     'of the global batch (train batch_size) on its own K '
                     'devices (K: the PipeliningLayer num_partitions), so '
                     'R x K devices are needed. 0 (default): every device, '
                     'R = devices // K. 1: no strategy. With '
                     '--pipeline_cluster: R replicas on the workers\' '
                     'devices (0 means 1 there).')
flags.DEFINE_enum('precision', 'float32',
                  ['float32', 'mixed_bfloat16', 'mixed_float16'],
                  'Mixed-precision policy (gpipe_tf.layers.precision): '
                  'float32 variables, 16-bit math and activations; '
                  'mixed_float16 trains with a dynamic loss scale (Keras '
                  'LossScaleOptimizer), whose overflowing steps are skipped '
                  'and counted as non-finite steps are.')
flags.DEFINE_string('profile_steps', '',
                    'A,B: profile the training steps A to B (global steps, '
                    '1-based, inclusive) with the TensorFlow profiler into '
                    'logdir/train/plugins/profile, for TensorBoard\'s Profile '
                    'tab (pip install tensorboard-plugin-profile to view it). '
                    'Empty (default): no profile.')
flags.DEFINE_enum('graph_optimizer', 'tensorflow', ['tensorflow', 'off'],
                  "TensorFlow's graph optimizer (Grappler), which rewrites "
                  "each step's graph on its first call: 'tensorflow' "
                  "(default): as TensorFlow configures it; 'off': disabled "
                  'in this process before any step is built, which cuts the '
                  'first step of a pipelined model (0.53-0.80x measured on a '
                  'CPU) and may slow its steps (up to 1.39x measured); '
                  'docs/scale.md.')
flags.DEFINE_bool('debug', False,
                  'On an error, print its traceback before the one-line '
                  'message.')


class FlagError(errors.Error, ValueError):
  """Trainer flags that cannot work (together, or with TF_CONFIG)."""
flags.DEFINE_string('pipeline_cluster', '',
                    'Run the cells on other hosts: JSON {"chief": '
                    '["this_host:port"], "worker": ["host:port", ...]}, a '
                    'file holding it, or TF_CONFIG. Every worker runs python '
                    '-m gpipe_tf.runtime.serve_worker with the same cluster. '
                    'With --num_replicas=R > 1, R data-parallel replicas of '
                    'the K cells (R x K worker devices; --num_replicas=0 '
                    'means 1 here); see docs/cross-host.md.')
flags.DEFINE_float('worker_timeout_seconds', 30.0,
                   'With --pipeline_cluster: how long to wait for the workers '
                   'at start-up, and for a worker to answer a health check '
                   '(sent every 2 s) before the run ends with an error.')


def _Fail(message: str) -> NoReturn:
  """Exits with status 1 and `message` on one line of stderr."""
  sys.exit('trainer: error: ' + ' '.join(str(message).split()))


def _FailOn(error: BaseException, message: str | None = None) -> NoReturn:
  """_Fail with '<ErrorClass>: <error>' (or `message`); --debug: traceback too."""
  if FLAGS.debug:
    traceback.print_exception(error)
  _Fail(message or f'{type(error).__name__}: {error}')
def _FailNow(message: str) -> NoReturn:
  """_Fail from any thread, at once: the main thread may be stuck in TensorFlow."""
  with _FAIL_LOCK:
    sys.stderr.write('trainer: error: ' + ' '.join(str(message).split()) +
                     '\n')
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


_FAIL_LOCK = threading.Lock()


def _ConnectPipelineCluster():
  """Connects to --pipeline_cluster before any op; returns the cluster."""
  from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import worker_health  # pylint: disable=g-import-not-at-top
  if FLAGS.num_logical_devices > 1:
    _Fail('--num_logical_devices splits this host, but with '
          '--pipeline_cluster the cells run on the workers: pass '
          '--num_logical_devices to serve_worker instead.')
  try:
    cluster = pipeline_cluster.ParseCluster(FLAGS.pipeline_cluster)
    names = pipeline_cluster.ConnectToCluster(cluster,
                                              FLAGS.worker_timeout_seconds)
  except (pipeline_cluster.PipelineClusterError,
          worker_health.WorkerUnreachableError) as e:
    _FailNow(str(e))
  logging.info('Connected to the pipeline cluster %s; devices: %s',
               cluster.AsJson(), names)
  return cluster


def _PlaceCells(params, cluster):
  """Lays R x K cells over the cluster's workers; returns the strategy.

  Sets the model's PipeliningLayer devices to replica 0's cells. With
  --num_replicas=R > 1 returns the in-graph MirroredStrategy over the
  replicas' first devices (distribute.ReplicaLayout.OnCluster), else None.
  """
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import distribute  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top
  model = params.task.model
  if not (isinstance(model.cls, type) and
          issubclass(model.cls, pipeline.PipeliningLayer)):
    _FailNow(f'--pipeline_cluster places the cells of a PipeliningLayer, but '
             f'{FLAGS.model} has a task.model of class {model.cls.__name__}; '
             'use a pipelined experiment.')
  num_replicas = max(1, FLAGS.num_replicas)
  try:
    rows = pipeline_cluster.ReplicaPipelineDevices(
        num_replicas, pipeline.PipeliningLayer.NumDevicesOf(model), cluster)
  except pipeline_cluster.PipelineClusterError as e:
    _FailNow(str(e))
  model.devices = rows[0]
  for r, row in enumerate(rows):
    for k, device in enumerate(row):
      logging.info('Pipeline cluster: %scell %d on %s',
                   f'replica {r} ' if num_replicas > 1 else '', k, device)
  return distribute.ReplicaLayout.OnCluster(
      rows, cluster.client_device).MakeStrategy()


def _OnWorkerFailure(cluster, index, what: str) -> NoReturn:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import worker_health  # pylint: disable=g-import-not-at-top
  newest = tf.train.latest_checkpoint(os.path.join(FLAGS.logdir, 'ckpt'))
  _FailNow(worker_health.FailureMessage(cluster, index, what, newest))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.model or not FLAGS.logdir:
    raise app.UsageError('--model and --logdir are required.')
  try:
    _Run()
  except errors.Error as e:
    _FailOn(e)


def _Run() -> None:
  """Reads the experiment, sets up the devices, trains and evaluates."""
  # Imported here so that --help stays fast and logical devices are set up
  # before TensorFlow runs any op.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import cluster  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import worker_health  # pylint: disable=g-import-not-at-top

  pipe_cluster = _ConnectPipelineCluster() if FLAGS.pipeline_cluster else None
  multi_worker = pipe_cluster is None and cluster.NumTrainingTasks() > 1
  if multi_worker and FLAGS.num_replicas not in (0, 1):
    raise FlagError(
        f'--num_replicas={FLAGS.num_replicas} splits one host; under a '
        'TF_CONFIG cluster every task is one replica: start one task per '
        'replica instead (several per host need their own devices each).')
  if FLAGS.num_logical_devices < 0:
    raise FlagError(f'--num_logical_devices={FLAGS.num_logical_devices}: '
                    'use N > 1 to split the CPU, 1 for no split, 0 for R x K.')
  profile_steps = _ProfileSteps()
  # Building Params runs no TensorFlow op: the devices can still be split.
  params = model_registry.GetParams(FLAGS.model)
  if FLAGS.model_params_override:
    _ApplyOverrides(params)
  monitor = None
  strategy = None
  if pipe_cluster is not None:
    strategy = _PlaceCells(params, pipe_cluster)
    monitor = worker_health.WorkerMonitor(
        pipe_cluster, lambda i, why: _OnWorkerFailure(pipe_cluster, i, why),
        interval_seconds=min(2.0, FLAGS.worker_timeout_seconds / 2),
        timeout_seconds=FLAGS.worker_timeout_seconds).Start()
  elif not (tf.config.list_physical_devices('GPU') or
            tf.config.list_physical_devices('TPU')):
    _SplitCpu(params, multi_worker)

  if FLAGS.graph_optimizer == 'off':
    tf.config.optimizer.set_experimental_options(
        {'disable_meta_optimizer': True})
    logging.info('Graph optimizer off (--graph_optimizer=off): steps run '
                 'their graphs as traced.')
  from gpipe_tf.train import loop  # pylint: disable=g-import-not-at-top
  if multi_worker:
    # Before any other op: collective ops are configured at start-up. Waits
    # until every task of the cluster has started.
    strategy = cluster.MakeMultiWorkerStrategy(
        FLAGS.collective_timeout_seconds)
    logging.info('Task %s of %d joined the cluster; its devices: %s',
                 cluster.TaskName(strategy), strategy.num_replicas_in_sync,
                 devices.DefaultDevices())
  try:
    result = loop.train_and_evaluate(
        params, FLAGS.logdir, FLAGS.mode, FLAGS.max_steps,
        save_interval_steps=FLAGS.save_interval_steps,
        log_interval_steps=FLAGS.log_interval_steps,
        eval_interval_steps=FLAGS.eval_interval_steps,
        eval_steps=FLAGS.eval_steps,
        max_checkpoints_to_keep=FLAGS.max_checkpoints_to_keep,
        on_nonfinite=FLAGS.on_nonfinite, deterministic=FLAGS.deterministic,
        num_replicas=1 if pipe_cluster else FLAGS.num_replicas,
        strategy=strategy,
        checkpoint_io_device=(pipe_cluster.client_device if pipe_cluster
                              else None),
        profile_steps=profile_steps, precision=FLAGS.precision)
  except errors.Error as e:
    # A checkpoint write that failed because a worker died is the worker's
    # failure, said as such.
    if pipe_cluster is not None and isinstance(e.__cause__,
                                               cluster.PEER_FAILURE_ERRORS):
      _OnWorkerFailure(pipe_cluster,
                       pipeline_cluster.FailedWorker(pipe_cluster, e.__cause__),
                       f'failed or hung up ({str(e).split(" (")[0]})')
    raise
  except cluster.PEER_FAILURE_ERRORS as e:
    if pipe_cluster is not None:
      _OnWorkerFailure(pipe_cluster,
                       pipeline_cluster.FailedWorker(pipe_cluster, e),
                       f'failed or hung up ({worker_health.ErrorSummary(e)})')
    if strategy is None:
      raise
    # Without TensorFlow's '{{function_node ...}}' prefix.
    first_line = re.sub(r'\{\{[^}]*\}\}\s*', '',
                        (str(e).strip().splitlines() or [''])[0])[:300]
    newest = tf.train.latest_checkpoint(os.path.join(FLAGS.logdir, 'ckpt'))
    _FailOn(e, f'task {cluster.TaskName(strategy)}: another task of the job '
            f'failed or stopped answering ({type(e).__name__}: {first_line}). '
            'MultiWorkerMirroredStrategy is not elastic: restart every task '
            'with the same command and TF_CONFIG; training resumes from the '
            f'newest checkpoint ({newest or "none yet"}).')
  if monitor is not None:
    monitor.Stop()
  logging.info('Done at global step %d (started at %d).', result.global_step,
               result.start_step)
  if result.eval_metrics:  # The run's answer, on stdout.
    print(f'Final evaluation at global step {result.global_step}: ' +
          ', '.join(f'{k}={v:.4f}' for k, v in
                    sorted(result.eval_metrics.items())))


def _ProfileSteps() -> tuple[int, int] | None:
  """--profile_steps=A,B as (A, B); None when empty."""
  text = FLAGS.profile_steps.strip()
  if not text:
    return None
  parts = text.split(',')
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or not (
      1 <= int(parts[0]) <= int(parts[1])):
    raise FlagError(f'--profile_steps={FLAGS.profile_steps!r}: give two global '
                    'steps A,B with 1 <= A <= B, e.g. --profile_steps=10,12.')
  return int(parts[0]), int(parts[1])


def _ApplyOverrides(params) -> None:
  """--model_params_override onto `params`; its errors name the flag."""
  try:
    base_experiment.ApplyOverrides(params, FLAGS.model_params_override)
  except errors.Error as e:
    raise type(e)(f'--model_params_override: {e}') from e


def _SplitCpu(params, multi_worker: bool) -> None:
  """Splits the CPU as --num_logical_devices says (0: R x K of `params`).

  Must run before TensorFlow runs any op; under a TF_CONFIG cluster it lists
  no device (that would start TensorFlow before the strategy).
  """
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  automatic = FLAGS.num_logical_devices == 0
  if automatic:
    num_cells = pipeline.PipeliningLayer.NumDevicesOf(params.task.model)
    num_replicas = 1 if multi_worker else max(1, FLAGS.num_replicas)
    count = num_replicas * num_cells
  else:
    count = FLAGS.num_logical_devices
  if count <= 1:
    return
  names = None
  try:
    if multi_worker:
      devices.ConfigureCpuSplit(count)  # Listing would start TensorFlow.
    else:
      names = devices.SplitCpu(count)
  except devices.DeviceConfigError:
    if not automatic:
      raise
    # Only when main() runs in a process that already started TensorFlow.
    logging.warning('TensorFlow has already started: keeping its devices '
                    'instead of splitting the CPU into %d.', count)
    return
  if automatic:
    logging.info('Split the CPU into %d logical devices for %d replicas x %d '
                 'cells (set --num_logical_devices to choose)', count,
                 num_replicas, num_cells)
  elif names:
    logging.info('Split the CPU into %d logical devices: %s', count, names)


if __name__ == '__main__':
  app.run(main)
