"""Data parallelism over pipelines: R replicas of a K-cell pipeline, on one host or several.

One host (``MakeStrategy``), R x K devices (the logical CPU devices, or the
GPUs)::

  replica 0: cells on devices 0 .. K-1          strategy device: device 0
  replica 1: cells on devices K .. 2K-1         strategy device: device K
  ...
  replica r: cells on devices rK .. rK+K-1      strategy device: device rK

A ``tf.distribute.MirroredStrategy`` over the first device of each replica
group splits the global batch across replicas and all-reduces the gradients;
inside a replica, ``PipeliningLayer`` asks ``ReplicaDevices`` for the devices
of its cells. Variables are MirroredVariables whose component r lives on the
strategy device of replica r (device rK): every cell of replica r reads its
weights from there.

Several hosts (``MakeMultiWorkerStrategy``): the TF_CONFIG environment
variable names a cluster of W > 1 training tasks ('chief' and/or 'worker');
every task runs the same program and is ONE replica, whose K cells sit on
that task's own devices (never on another task's)::

  replica 0 = chief, else worker 0:  /job:worker/replica:0/task:0/device:CPU:0 .. :K-1
  replica 1 = next worker:           /job:worker/replica:0/task:1/device:CPU:0 .. :K-1
  ...                                (GPU:k instead of CPU:k on GPU hosts)

A ``tf.distribute.MultiWorkerMirroredStrategy`` with one device per task
(its device 0) all-reduces the gradients with collective ops. Every task
reads the whole stream of global batches and keeps its share
(``ShareOfBatch``: contiguous rows, replica r's after replica r-1's), so W
replicas train like one device on the global batch. The chief writes
checkpoints, summaries and params.txt; a checkpoint save may need every task
(collective reads), so the others save too, into a scratch directory of
their own that is deleted after each save (``ScratchDirectory``).
MultiWorkerMirroredStrategy is not elastic: when a task dies the others fail
(``PEER_FAILURE_ERRORS``) and the whole job is restarted; it resumes from the
chief's newest checkpoint, which every task must be able to read.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from absl import logging
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.runtime import devices as devices_lib


TRAINING_TASK_TYPES = ('chief', 'worker')

# What a collective op raises when a peer task died (heartbeats stopped,
# connection reset) or did not answer within the collective timeout.
PEER_FAILURE_ERRORS = (tf.errors.UnavailableError,
                       tf.errors.DeadlineExceededError,
                       tf.errors.AbortedError, tf.errors.CancelledError)


class ReplicaLayoutError(errors.Error, ValueError):
  """R replicas x K cells do not fit the devices there are."""


class ClusterConfigError(errors.Error, ValueError):
  """TF_CONFIG is malformed or describes a cluster this trainer cannot run."""


class WorkerMismatchError(errors.Error, RuntimeError):
  """The tasks of a multi-worker job disagree (e.g. on the restored step)."""


def ReplicaId() -> int | None:
  """The id of the current replica, or None outside a multi-replica context.

  Under MirroredStrategy ``replica_id_in_sync_group`` is a constant tensor
  (in a tf.function as well as eagerly); a Python int is accepted too.

  Raises:
    ReplicaLayoutError: the replica id is not known when the graph is built
      (e.g. a TPU replica), so per-replica devices cannot be chosen.
  """
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync <= 1:
    return None
  replica = ctx.replica_id_in_sync_group
  if isinstance(replica, int):
    return replica
  value = tf.get_static_value(replica)
  if value is None:
    raise ReplicaLayoutError(
        'The replica id is not a constant in this strategy; pass explicit '
        'PipeliningLayer devices instead of relying on per-replica devices.')
  return int(value)


def ReplicaDevices(num_cells: int, all_devices: Sequence[str] | None = None
                   ) -> list[str] | None:
  """Devices of the K cells of the current replica, or None if not replicated.

  Under a multi-worker strategy (and without `all_devices`) these are the
  first K devices of this task (``Layout``), checked to be this task's own.

  Args:
    num_cells: K, the cells per replica.
    all_devices: the devices to cut into replica groups; default
      ``devices.DefaultDevices()``.

  Raises:
    ReplicaLayoutError: fewer than R*K devices (a task with fewer than K
      devices), or a replica whose cells would sit on another task.
  """
  replica = ReplicaId()
  if replica is None:
    return None
  strategy = tf.distribute.get_strategy()
  if all_devices is None and IsMultiWorker(strategy):
    cells = Layout(strategy, num_cells)[replica]
    _CheckOnThisTask(strategy, cells)
    logging.info('Replica %d (task %s) pipelines on %s', replica,
                 TaskName(strategy), ', '.join(cells))
    return cells
  num_replicas = tf.distribute.get_replica_context().num_replicas_in_sync
  all_devices = list(all_devices or devices_lib.DefaultDevices())
  _CheckFits(num_replicas, num_cells, all_devices)
  return all_devices[replica * num_cells:(replica + 1) * num_cells]


def BatchedAllReduce(reduce_op: tf.distribute.ReduceOp, values: Any) -> Any:
  """All-reduces a nest of tensors across replicas, in one collective per dtype.

  Call in a replica context. The values are copied to the replica's device
  first: TensorFlow reduces values that sit on other devices (a pipeline's
  cells) one by one, which across workers costs one network round trip each.
  Measured, 2 tasks on localhost, TinyPipelined: 10 collectives per step -> 2,
  ~26-36 -> ~34-49 steps/s (interleaved runs on a busy 2-core machine).
  """
  flat = tf.nest.flatten(values)
  groups: dict[tf.DType, list[int]] = {}
  for i, value in enumerate(flat):
    groups.setdefault(value.dtype, []).append(i)
  context = tf.distribute.get_replica_context()
  reduced = list(flat)
  for indices in groups.values():
    results = context.all_reduce(reduce_op,
                                 [tf.identity(flat[i]) for i in indices])
    for i, result in zip(indices, results):
      reduced[i] = result
  return tf.nest.pack_sequence_as(values, reduced)


def _CheckFits(num_replicas: int, num_cells: int,
               all_devices: Sequence[str]) -> None:
  if num_replicas * num_cells > len(all_devices):
    raise ReplicaLayoutError(
        f'{num_replicas} replicas x {num_cells} cells need '
        f'{num_replicas * num_cells} devices but there are {len(all_devices)} '
        f'({list(all_devices)}); lower num_replicas or num_partitions, or add '
        'logical devices (--num_logical_devices).')


def NumReplicasThatFit(num_cells: int,
                       all_devices: Sequence[str] | None = None) -> int:
  """R that uses every device: len(devices) // K, at least 1.

  With fewer devices than K this is 1, and the pipeline itself then says that
  its cells do not fit (PartitionError).
  """
  if num_cells < 1:
    raise ReplicaLayoutError(f'num_cells must be >= 1, got {num_cells}.')
  all_devices = list(all_devices or devices_lib.DefaultDevices())
  return max(1, len(all_devices) // num_cells)


def ReplicaGroups(num_replicas: int, num_cells: int,
                  all_devices: Sequence[str] | None = None) -> list[list[str]]:
  """The devices of every replica's cells: [[d0 .. dK-1], [dK .. d2K-1], ...]."""
  all_devices = list(all_devices or devices_lib.DefaultDevices())
  _CheckFits(num_replicas, num_cells, all_devices)
  return [all_devices[r * num_cells:(r + 1) * num_cells]
          for r in range(num_replicas)]


def MakeStrategy(num_replicas: int, num_cells: int,
                 all_devices: Sequence[str] | None = None
                 ) -> tf.distribute.Strategy | None:
  """A MirroredStrategy over the first device of each replica group.

  On CPU devices the strategy reduces through one device
  (ReductionToOneDevice) instead of collective ops.

  Returns None for one replica (no strategy: the default one is used).

  Raises:
    ReplicaLayoutError: fewer than num_replicas * num_cells devices, or
      num_replicas < 1.
  """
  if num_replicas < 1:
    raise ReplicaLayoutError(f'num_replicas must be >= 1, got {num_replicas}.')
  if num_replicas == 1:
    return None
  groups = ReplicaGroups(num_replicas, num_cells, all_devices)
  strategy_devices = [g[0] for g in groups]
  cross_device_ops = None  # NCCL (or the strategy's default) on GPUs.
  if all(tf.DeviceSpec.from_string(d).device_type == 'CPU'
         for d in strategy_devices):
    # Not collectives: their group keys are process-wide, so a second
    # strategy over other CPU devices in the same process would collide with
    # the first ("joining a group that is already full").
    cross_device_ops = tf.distribute.ReductionToOneDevice()
  return tf.distribute.MirroredStrategy(strategy_devices,
                                        cross_device_ops=cross_device_ops)


# ---- Several hosts ----------------------------------------------------------


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
  """How many training tasks (chief and workers) TF_CONFIG names; 0 if unset."""
  config = ClusterFromEnvironment(environ)
  return len(TaskOrder(config['cluster'])) if config else 0


def WorkerGroups(task_order: Sequence[tuple[str, int]],
                 device_names: Sequence[str], num_cells: int
                 ) -> list[list[str]]:
  """The cell devices of every replica (task) of a multi-worker job.

  Pure: replica r is task_order[r]; its cells are that task's first K
  devices among `device_names` (fully qualified names such as
  '/job:worker/replica:0/task:1/device:CPU:0'), by device index.

  Raises:
    ReplicaLayoutError: a task has fewer than K devices.
  """
  groups = []
  for kind, index in task_order:
    own = sorted((spec.device_index or 0, name) for name, spec in (
        (n, tf.DeviceSpec.from_string(n)) for n in device_names)
                 if spec.job == kind and (spec.task or 0) == index)
    if len(own) < num_cells:
      raise ReplicaLayoutError(
          f'Task {kind}:{index} has {len(own)} devices '
          f'({[n for _, n in own]}) but each replica pipelines {num_cells} '
          'cells on its own devices; give every task at least that many (GPUs, '
          'or --num_logical_devices on a CPU host), or lower num_partitions.')
    groups.append([name for _, name in own[:num_cells]])
  return groups


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

  Raises:
    ClusterConfigError: no cluster, fewer than 2 training tasks, or this
      task is not a 'chief' or 'worker'.
  """
  config = ClusterFromEnvironment(environ)
  if config is None:
    raise ClusterConfigError('TF_CONFIG names no cluster; a multi-worker job '
                             'needs one (see docs/distributed.md, Several '
                             'hosts).')
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
  return len(TaskOrder(strategy.cluster_resolver.cluster_spec().as_dict())) > 1


def IsChief(strategy: tf.distribute.Strategy | None) -> bool:
  """Whether this process writes checkpoints and summaries (True on one host)."""
  return strategy is None or bool(strategy.extended.should_checkpoint)


def TaskName(strategy: tf.distribute.Strategy) -> str:
  """'worker:1' for a multi-worker task, '' otherwise."""
  if not IsMultiWorker(strategy):
    return ''
  resolver = strategy.cluster_resolver
  return f'{resolver.task_type}:{resolver.task_id}'


def Layout(strategy: tf.distribute.Strategy, num_cells: int
           ) -> list[list[str]]:
  """The devices of every replica's K cells: [[replica 0's], [replica 1's], ...].

  On one host: ``ReplicaGroups``. Multi-worker: ``WorkerGroups`` over every
  task's devices of this task's kind (GPU or CPU), as TensorFlow lists them
  once the cluster is up.

  Raises:
    ReplicaLayoutError: too few devices.
  """
  if not IsMultiWorker(strategy):
    return ReplicaGroups(strategy.num_replicas_in_sync, num_cells)
  kind = tf.DeviceSpec.from_string(
      strategy.extended.worker_devices[0]).device_type
  names = [d.name for d in tf.config.list_logical_devices(kind)]
  return WorkerGroups(
      TaskOrder(strategy.cluster_resolver.cluster_spec().as_dict()), names,
      num_cells)


def _CheckOnThisTask(strategy: tf.distribute.Strategy,
                     cells: Sequence[str]) -> None:
  resolver = strategy.cluster_resolver
  for device in cells:
    spec = tf.DeviceSpec.from_string(device)
    if (spec.job, spec.task) != (resolver.task_type, resolver.task_id):
      raise ReplicaLayoutError(
          f'The replica of task {resolver.task_type}:{resolver.task_id} would '
          f'run a cell on {device}, a device of another task. Every task of a '
          'multi-worker job must be one replica (one MultiWorkerMirrored'
          'Strategy device per task: MakeMultiWorkerStrategy).')


def ShareOfBatch(batch: Any, replica: int, num_replicas: int) -> Any:
  """Replica `replica`'s rows of a global batch (a nest of tensors).

  Rows are split into `num_replicas` contiguous shares whose sizes differ by
  at most one, larger ones first (N=10, R=4: 3, 3, 2, 2). Rank-0 tensors are
  shared, not split.
  """
  first = tf.nest.flatten(batch)[0]
  n = tf.shape(first, out_type=tf.int64)[0]
  size, extra = n // num_replicas, n % num_replicas
  start = replica * size + tf.minimum(tf.constant(replica, tf.int64), extra)
  end = start + size + tf.cast(replica < extra, tf.int64)

  def _Rows(x):
    return x if x.shape.rank == 0 else x[start:end]

  return tf.nest.map_structure(_Rows, batch)


def DistributeDataset(strategy: tf.distribute.Strategy,
                      dataset: tf.data.Dataset) -> Any:
  """Splits every global batch of `dataset` across the strategy's replicas.

  One host: ``experimental_distribute_dataset`` (TensorFlow re-batches each
  global batch into R shares). Multi-worker: every task builds the whole
  stream and keeps ``ShareOfBatch`` for its replica, so no task depends on
  file-level sharding and the split is the same whatever the input is.
  """
  if not IsMultiWorker(strategy):
    return strategy.experimental_distribute_dataset(dataset)
  num_replicas = strategy.num_replicas_in_sync

  def _DatasetOfTask(context: tf.distribute.InputContext) -> tf.data.Dataset:
    if context.num_input_pipelines != num_replicas:
      raise ReplicaLayoutError(
          f'{num_replicas} replicas over {context.num_input_pipelines} '
          'tasks; a multi-worker job needs one replica per task '
          '(MakeMultiWorkerStrategy).')
    replica = context.input_pipeline_id

    @tf.autograph.experimental.do_not_convert
    def _Share(*parts):
      return ShareOfBatch(parts[0] if len(parts) == 1 else parts, replica,
                          num_replicas)

    return dataset.map(_Share)

  return strategy.distribute_datasets_from_function(_DatasetOfTask)


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
  CheckValuesAgree(
      TaskOrder(strategy.cluster_resolver.cluster_spec().as_dict()), values,
      what, hint)


def CheckValuesAgree(task_order: Sequence[tuple[str, int]],
                     values: Sequence[int], what: str, hint: str) -> None:
  """Raises WorkerMismatchError naming each task's value unless all are equal."""
  if len(set(values)) > 1:
    listing = ', '.join(f'{k}:{i}={v}' for (k, i), v in zip(task_order,
                                                             values))
    raise WorkerMismatchError(f'The tasks disagree on the {what} ({listing}); '
                              f'{hint}')
