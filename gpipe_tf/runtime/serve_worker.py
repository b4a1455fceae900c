"""The worker binary of a pipeline cluster: a tf.distribute.Server that hosts this machine's devices.

Usage, on each worker host (the same --cluster everywhere; see
docs/cross-host.md)::

  python -m gpipe_tf.runtime.serve_worker \\
      --cluster='{"chief": ["trainer:2222"], "worker": ["h1:2222", "h2:2222"]}' \\
      --task_index=1 [--num_logical_devices=2]

--cluster also takes the path of a file holding that JSON, or TF_CONFIG
(then --task_index defaults to TF_CONFIG's worker task). The server runs
until it is killed; it runs no Python of its own: the trainer (the chief)
places the pipeline's cells on its devices. It prints one line when it is
listening, naming its task and devices.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from absl import app
from absl import flags

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


def _Fail(message: str) -> None:
  raise SystemExit('serve_worker: error: ' + ' '.join(str(message).split()))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
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
  server.join()


if __name__ == '__main__':
  app.run(main)
