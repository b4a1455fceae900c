"""The worker binary of a pipeline cluster: a tf.distribute.Server that hosts this machine's devices.

Usage, on each worker host (the same --cluster everywhere; see
docs/cross-host.md)::

  python -m gpipe_tf.runtime.serve_worker \\
      --cluster='{"chief": ["trainer:2222"], "worker": ["h1:2222", "h2:2222"]}' \\
      --task_index=1 [--num_logical_devices=2] \\
      [--cpu_cores=3 --intra_op_threads=1 --inter_op_threads=2] [--stats_on_stdin]

--cluster also takes the path of a file holding that JSON, or TF_CONFIG
(then --task_index defaults to TF_CONFIG's worker task). The server runs
until it is killed; it runs no Python of its own: the trainer (the chief)
places the pipeline's cells on its devices. It prints one line when it is
listening, naming its task and devices.

To make a worker behave like one accelerator on a CPU host (what
gpipe_tf.runtime.local_workers does), pin it to cores (--cpu_cores, before
TensorFlow starts a thread) and give it one intra-op thread, so its device
runs its ops one after another. With --stats_on_stdin it answers lines on
its stdin: ``memory`` with one line ``serve_worker: stats {"current": B,
"peak": B}`` (its own allocator, TensorFlow's BFC allocator, since the CPU's
default one keeps no statistics), ``reset`` with the same line, after which
the peak counts afresh.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Sequence

from absl import app
from absl import flags

from gpipe_tf.runtime import local_workers  # Runs no TensorFlow.

__all__ = ['main']

FLAGS = flags.FLAGS

flags.DEFINE_string('cluster', 'TF_CONFIG',
                    'The pipeline cluster: JSON {"chief": ["host:port"], '
                    '"worker": ["host:port", ...]}, a file holding it, or '
                    'TF_CONFIG (read that environment variable).')
flags.DEFINE_integer('task_index', -1,
                     'This worker\'s index in the "worker" list; -1: '
                     "TF_CONFIG's task index.")
flags.DEFINE_integer('num_logical_devices', 0,
                     'If > 1 and the host has no GPU, split the CPU into this '
                     'many logical devices, one per cell this worker hosts.')
flags.DEFINE_list('cpu_cores', [],
                  'Pin this process to these CPU cores (os.sched_setaffinity) '
                  'before TensorFlow starts; empty: every core.')
flags.DEFINE_integer('intra_op_threads', 0,
                     'Threads one op may use; 1 runs a device\'s ops one after '
                     "another, as an accelerator does. 0: TensorFlow's default.")
flags.DEFINE_integer('inter_op_threads', 0,
                     "Ops run at once; 0: TensorFlow's default.")
flags.DEFINE_bool('stats_on_stdin', False,
                  'Answer "memory" / "reset" lines on stdin with this '
                  "process's allocator statistics (see the module docstring).")


def _Fail(message: str) -> None:
  raise SystemExit('serve_worker: error: ' + ' '.join(str(message).split()))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.cpu_cores:  # Before any thread exists: threads inherit it.
    try:
      os.sched_setaffinity(0, {int(c) for c in FLAGS.cpu_cores})
    except (ValueError, OSError) as e:
      _Fail(f'Cannot pin to --cpu_cores={",".join(FLAGS.cpu_cores)} ({e}); '
            f'this host has cores {sorted(os.sched_getaffinity(0))}.')
  if FLAGS.stats_on_stdin:  # Read when the CPU allocator is created.
    os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  # Imported here so that --help stays fast.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top

  try:
    cluster = pipeline_cluster.ParseCluster(FLAGS.cluster)
  except pipeline_cluster.PipelineClusterError as e:
    _Fail(e)
  index = FLAGS.task_index
  if index < 0:
    task = json.loads(os.environ.get('TF_CONFIG') or '{}').get('task') or {}
    if task.get('type') != pipeline_cluster.WORKER_JOB:
      _Fail('Pass --task_index=i, this worker\'s place in the "worker" list '
            '(or a TF_CONFIG whose task is {"type": "worker", "index": i}).')
    index = int(task['index'])
  if index >= len(cluster.workers):
    _Fail(f'--task_index={index} but the cluster has '
          f'{len(cluster.workers)} workers (indices from 0).')
  if FLAGS.num_logical_devices > 1 and not tf.config.list_physical_devices(
      'GPU'):
    devices.ConfigureCpuSplit(FLAGS.num_logical_devices)
  if FLAGS.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(
        FLAGS.intra_op_threads)
  if FLAGS.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(
        FLAGS.inter_op_threads)
  try:
    server = tf.distribute.Server(
        cluster.Spec(), job_name=pipeline_cluster.WORKER_JOB,
        task_index=index, protocol=cluster.protocol,
        config=context.context().config, start=True)
  except tf.errors.OpError as e:
    _Fail(f'Cannot serve {cluster.Describe(index)}: {e.message}; is the port '
          'in use or the host not this one?')
  names = [d.name for d in tf.config.list_logical_devices()]
  print(f'serve_worker: {cluster.Describe(index)} is serving devices '
        f'{names}', flush=True)
  if FLAGS.stats_on_stdin:
    threading.Thread(target=_AnswerStats, args=(tf,), daemon=True).start()
  server.join()


def _AnswerStats(tf) -> None:
  """Answers 'memory' and 'reset' lines on stdin until it closes.

  Either prints the statistics; 'reset' then resets the peak (so once its
  answer is read, the peak counts from there).
  """
  for line in sys.stdin:
    command = line.strip()
    if command not in ('memory', 'reset'):
      continue
    info = tf.config.experimental.get_memory_info('CPU:0')
    if command == 'reset':
      tf.config.experimental.reset_memory_stats('CPU:0')
    stats = {'current': int(info['current']), 'peak': int(info['peak'])}
    print(local_workers.STATS_PREFIX + json.dumps(stats), flush=True)


if __name__ == '__main__':
  app.run(main)
