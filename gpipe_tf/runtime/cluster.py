"""Several hosts: the TF_CONFIG cluster, its MultiWorkerMirroredStrategy, and what differs between its tasks.

The TF_CONFIG environment variable names a cluster of W > 1 training tasks
('chief' and/or 'worker'). Every task runs the same program and is ONE
replica (``MakeMultiWorkerStrategy``); replica r is the r-th task of
``TaskOrder``: the chief, then the workers::

  TF_CONFIG cluster {'chief': [h0], 'worker': [h1, h2]}
  replica 0 = chief:0     writes checkpoints, summaries, params.txt (IsChief)
  replica 1 = worker:0    saves into logdir/scratch_worker_0, deleted after
  replica 2 = worker:1    saves into logdir/scratch_worker_1, deleted after

Where each replica's cells run is the replica layout's business
(``gpipe_tf.runtime.distribute``). A checkpoint save may need every task
(collective reads), so the non-chief tasks save too, into a scratch directory
of their own (``ScratchDirectory``). After restoring, the tasks check that
they resume from the same step (``CheckTasksAgree``).
MultiWorkerMirroredStrategy is not elastic: when a task dies the others fail
(``PEER_FAILURE_ERRORS``) and the whole job is restarted; it resumes from the
chief's newest checkpoint, which every task must be able to read.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import tensorflow as tf

from gpipe_tf import errors

__all__ = ['CheckTasksAgree', 'CheckValuesAgree', 'ClusterConfigError',
           'ClusterFromEnvironment', 'IsChief', 'IsMultiWorker',
           'MakeMultiWorkerStrategy', 'NumTrainingTasks', 'PEER_FAILURE_ERRORS',
           'ScratchDirectory', 'StrategyTaskOrder', 'TRAINING_TASK_TYPES',
           'TaskName', 'TaskOrder', 'WorkerMismatchError']

TRAINING_TASK_TYPES = ('chief', 'worker')

# What a collective op raises when a peer task died (heartbeats stopped,
# connection reset) or did not answer within the collective timeout.
PEER_FAILURE_ERRORS = (tf.errors.UnavailableError,
                       tf.errors.DeadlineExceededError,
                       tf.errors.AbortedError, tf.errors.CancelledError)


class ClusterConfigError(errors.Error, ValueError):
  """TF_CONFIG is malformed or describes a cluster this trainer cannot run."""


class WorkerMismatchError(errors.Error, RuntimeError):
  """The tasks of a multi-worker job disagree (e.g. on the restored step)."""


def ClusterFromEnvironment(environ: Mapping[str, str] | None = None
                           ) -> dict[str, Any] | None:
  """The parsed TF_CONFIG ({'cluster': ..., 'task': ...}); None without a cluster.

  Raises:
    ClusterConfigError: TF_CONFIG is not JSON, or lacks 'cluster' or 'task'.
  """
  text = (os.environ if environ is None else environ).get('TF_CONFIG', '')
  if not text.strip():
    return None
  try:
    config = json.loads(text)
  except ValueError as e:
    raise ClusterConfigError(f'TF_CONFIG is not valid JSON ({e}): {text!r}'
                             ) from e
  if not isinstance(config, dict):
    raise ClusterConfigError(f'TF_CONFIG must be a JSON object, got {text!r}')
  if not config.get('cluster'):
    return None
  task = config.get('task')
  if not isinstance(task, dict) or 'type' not in task or 'index' not in task:
    raise ClusterConfigError(
        "TF_CONFIG names a cluster but no task: add \"task\": {\"type\": "
        f'"worker", "index": i}} for this process. Got {text!r}')
  return config


def TaskOrder(cluster: Mapping[str, Sequence[str]]) -> list[tuple[str, int]]:
  """The training tasks in replica order: the chief, then the workers."""
  return [(kind, i) for kind in TRAINING_TASK_TYPES
          for i in range(len(cluster.get(kind, ())))]


def NumTrainingTasks(environ: Mapping[str, str] | None = None) -> int:
  """How many training tasks (chief and workers) TF_CONFIG names; 0 if unset.

  Raises:
    ClusterConfigError: TF_CONFIG is malformed (ClusterFromEnvironment).
  """
  config = ClusterFromEnvironment(environ)
  return len(TaskOrder(config['cluster'])) if config else 0


def MakeMultiWorkerStrategy(timeout_seconds: float = 0.0,
                            environ: Mapping[str, str] | None = None
                            ) -> tf.distribute.MultiWorkerMirroredStrategy:
  """A MultiWorkerMirroredStrategy from TF_CONFIG: one replica per task.

  Must be called at program start-up, before TensorFlow runs any op (it
  configures collective ops and starts this task's server), but after any
  logical-device split (``devices.ConfigureCpuSplit``). It waits until every
  task of the cluster has started.

  Each task is one replica on its device 0 (GPU:0 if it has GPUs, else
  CPU:0); its other devices hold the pipeline's further cells. (By default
  TensorFlow would make one replica per GPU.)

  Args:
    timeout_seconds: a collective op (gradient all-reduce, ...) that has not
      completed after this long raises DeadlineExceededError instead of
      waiting for a peer forever; 0 disables the timeout. A dead peer is
      usually detected sooner by the coordination service's heartbeats.
    environ: where TF_CONFIG is read; default os.environ.

  Returns:
    The strategy; its ``num_replicas_in_sync`` is the number of tasks.

  Raises:
    ClusterConfigError: no cluster, fewer than 2 training tasks, or this
      task is not a 'chief' or 'worker'.
  """
  config = ClusterFromEnvironment(environ)
  if config is None:
    raise ClusterConfigError('TF_CONFIG names no cluster; a multi-worker job '
                             'needs one (see docs/distributed.md, Several hosts).')
  cluster, task = config['cluster'], config['task']
  if task['type'] not in TRAINING_TASK_TYPES:
    raise ClusterConfigError(
        f"This task's type is {task['type']!r}; only {TRAINING_TASK_TYPES} "
        'tasks train (no evaluator or parameter-server tasks).')
  if (task['type'], int(task['index'])) not in TaskOrder(cluster):
    raise ClusterConfigError(
        f"TF_CONFIG's task {task['type']}:{task['index']} is not in its "
        f'cluster {cluster}; task indices count from 0.')
  if len(TaskOrder(cluster)) < 2:
    raise ClusterConfigError(
        f'TF_CONFIG names {len(TaskOrder(cluster))} training task; '
        'multi-worker training needs at least 2 (else unset TF_CONFIG).')
  has_gpus = bool(tf.config.list_physical_devices('GPU'))
  # SimpleClusterResolver, not TFConfigClusterResolver: with the latter the
  # strategy makes one replica per local GPU.
  one_device = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), task_type=task['type'],
      task_id=int(task['index']),
      rpc_layer=config.get('rpc_layer') or 'grpc',
      num_accelerators={'GPU': 1} if has_gpus else {})
  options = tf.distribute.experimental.CommunicationOptions(
      timeout_seconds=timeout_seconds or None)
  return tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=one_device, communication_options=options)


def IsMultiWorker(strategy: tf.distribute.Strategy | None) -> bool:
  """Whether `strategy` spans several tasks (MultiWorkerMirroredStrategy)."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return False
  return len(StrategyTaskOrder(strategy)) > 1


def StrategyTaskOrder(strategy: tf.distribute.MultiWorkerMirroredStrategy
                      ) -> list[tuple[str, int]]:
  """TaskOrder of the cluster a multi-worker strategy runs on."""
  return TaskOrder(strategy.cluster_resolver.cluster_spec().as_dict())


def IsChief(strategy: tf.distribute.Strategy | None) -> bool:
  """Whether this process writes checkpoints and summaries (True on one host)."""
  return strategy is None or bool(strategy.extended.should_checkpoint)


def TaskName(strategy: tf.distribute.Strategy | None) -> str:
  """'worker:1' for a multi-worker task, '' otherwise."""
  if not IsMultiWorker(strategy):
    return ''
  resolver = strategy.cluster_resolver
  return f'{resolver.task_type}:{resolver.task_id}'


def ScratchDirectory(strategy: tf.distribute.Strategy | None,
                     logdir: str) -> str | None:
  """Where a non-chief task writes its share of a save; None on the chief."""
  if IsChief(strategy):
    return None
  resolver = strategy.cluster_resolver
  return os.path.join(logdir,
                      f'scratch_{resolver.task_type}_{resolver.task_id}')


def CheckTasksAgree(strategy: tf.distribute.Strategy | None, value: int,
                    what: str, hint: str) -> None:
  """Raises WorkerMismatchError unless every task has the same `value`.

  A collective (all-gather) over all tasks; a no-op on one host.
  """
  if not IsMultiWorker(strategy):
    return
  mine = tf.constant([value], tf.int64)

  def _Gather():
    return tf.distribute.get_replica_context().all_gather(mine, axis=0)

  gathered = tf.function(lambda: strategy.run(_Gather), autograph=False)()
  values = [int(v) for v in strategy.experimental_local_results(gathered)[0]]
  CheckValuesAgree(StrategyTaskOrder(strategy), values, what, hint)


def CheckValuesAgree(task_order: Sequence[tuple[str, int]],
                     values: Sequence[int], what: str, hint: str) -> None:
  """Raises WorkerMismatchError naming each task's value unless all are equal."""
  if len(set(values)) > 1:
    listing = ', '.join(f'{k}:{i}={v}' for (k, i), v in zip(task_order,
                                                             values))
    raise WorkerMismatchError(f'The tasks disagree on the {what} ({listing}); '
                              f'{hint}')
