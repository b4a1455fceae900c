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
from typing import NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging

from gpipe_tf import base_experiment
from gpipe_tf import errors
from gpipe_tf import model_registry

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
                     'R = devices // K. 1: no strategy.')
flags.DEFINE_bool('debug', False,
                  'On an error, print its traceback before the one-line '
                  'message.')


class FlagError(errors.Error, ValueError):
  """Trainer flags that cannot work (together, or with TF_CONFIG)."""


def _Fail(message: str) -> NoReturn:
  """Exits with status 1 and `message` on one line of stderr."""
  sys.exit('trainer: error: ' + ' '.join(str(message).split()))


def _FailOn(error: BaseException, message: str | None = None) -> NoReturn:
  """_Fail with '<ErrorClass>: <error>' (or `message`); --debug: traceback too."""
  if FLAGS.debug:
    traceback.print_exception(error)
  _Fail(message or f'{type(error).__name__}: {error}')


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

  multi_worker = cluster.NumTrainingTasks() > 1
  if multi_worker and FLAGS.num_replicas not in (0, 1):
    raise FlagError(
        f'--num_replicas={FLAGS.num_replicas} splits one host; under a '
        'TF_CONFIG cluster every task is one replica: start one task per '
        'replica instead (several per host need their own devices each).')
  if FLAGS.num_logical_devices < 0:
    raise FlagError(f'--num_logical_devices={FLAGS.num_logical_devices}: '
                    'use N > 1 to split the CPU, 1 for no split, 0 for R x K.')
  # Building Params runs no TensorFlow op: the devices can still be split.
  params = model_registry.GetParams(FLAGS.model)
  if FLAGS.model_params_override:
    _ApplyOverrides(params)
  if not (tf.config.list_physical_devices('GPU') or
          tf.config.list_physical_devices('TPU')):
    _SplitCpu(params, multi_worker)

  from gpipe_tf.train import loop  # pylint: disable=g-import-not-at-top
  strategy = None
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
        num_replicas=FLAGS.num_replicas, strategy=strategy)
  except cluster.PEER_FAILURE_ERRORS as e:
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
  logging.info('Done at global step %d (started at %d).', result.global_step,
               result.start_step)
  if result.eval_metrics:  # The run's answer, on stdout.
    print(f'Final evaluation at global step {result.global_step}: ' +
          ', '.join(f'{k}={v:.4f}' for k, v in
                    sorted(result.eval_metrics.items())))


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
