"""Data parallelism over pipelines: R replicas of a K-cell pipeline, and which device runs each cell.

A ``ReplicaLayout`` says it once: ``devices[r][k]`` is the device of cell k of
replica r. One host (``ReplicaLayout.Plan``), R x K devices (the logical CPU
devices, or the GPUs)::

  replica 0: cells on devices 0 .. K-1          strategy device: device 0
  replica 1: cells on devices K .. 2K-1         strategy device: device K
  ...
  replica r: cells on devices rK .. rK+K-1      strategy device: device rK

A ``tf.distribute.MirroredStrategy`` over the first device of each replica
(``ReplicaLayout.MakeStrategy``) splits the global batch across replicas and
all-reduces the gradients; inside a replica, ``PipeliningLayer`` asks
``ReplicaDevices`` for the devices of its cells. Variables are
MirroredVariables whose component r lives on the strategy device of replica r
(device rK): every cell of replica r reads its weights from there.

Several hosts (a MultiWorkerMirroredStrategy from TF_CONFIG,
``gpipe_tf.runtime.cluster``): every task is ONE replica, whose K cells sit
on that task's own devices (never on another task's)
(``ReplicaLayout.FromStrategy``)::

  replica 0 = chief, else worker 0:  /job:worker/replica:0/task:0/device:CPU:0 .. :K-1
  replica 1 = next worker:           /job:worker/replica:0/task:1/device:CPU:0 .. :K-1
  ...                                (GPU:k instead of CPU:k on GPU hosts)

The strategy has one device per task (its device 0) and all-reduces the
gradients with collective ops.

A pipeline cluster (gpipe_tf.runtime.pipeline_cluster: one trainer process,
cells on worker servers): ``ReplicaLayout.OnCluster`` takes the rows the
cluster's layout gives, e.g. R=2, K=2 on 2 workers of 2 devices::

  replica 0:  /job:worker/replica:0/task:0/device:CPU:0, CPU:1
  replica 1:  /job:worker/replica:0/task:1/device:CPU:0, CPU:1

and ``MakeStrategy`` gives an in-graph MirroredStrategy over each replica's
first device that this one process drives, without collective ops: sums go
through replica 0's first device (ReductionToOneDevice). The trainer keeps
the input: the step gets whole global batches and each replica cuts its
rows on the trainer's CPU (``ReplicaInput``). Every task reads the whole stream of global
batches and keeps its share (``ShareOfBatch``: contiguous rows, replica r's
after replica r-1's), so W replicas train like one device on the global
batch (``DistributeDataset``).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Sequence

from absl import logging
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.runtime import cluster
from gpipe_tf.runtime import devices as devices_lib

__all__ = ['BatchedAllReduce', 'ClusterReplicaDevices', 'DistributeDataset',
           'MakeStrategy', 'NumReplicasThatFit', 'ReplicaDevices', 'ReplicaId',
           'ReplicaInput', 'ReplicaLayout', 'ReplicaLayoutError',
           'ShareOfBatch', 'WorkerGroups']


class ReplicaLayoutError(errors.Error, ValueError):
  """R replicas x K cells do not fit the devices there are."""


@dataclasses.dataclass(frozen=True)
class ReplicaLayout:
  """Which device runs each cell of each replica: built once, then read.

  Build it with ``Plan`` (one host: R x K devices, in order) or
  ``FromStrategy`` (the layout a strategy made elsewhere implies, e.g. a
  multi-worker one). A layout deliberately does NOT own the strategy: on one
  host ``MakeStrategy`` makes one from it, a multi-worker strategy must be
  made at program start-up (``cluster.MakeMultiWorkerStrategy``).

  Attributes:
    devices_per_replica: K, the cells (devices) of one replica's pipeline.
    devices: devices[r][k], the device of cell k of replica r ([R][K]). One
      replica is not checked against the devices there are: its row may be
      shorter than K, and the PipeliningLayer then raises PartitionError.
    task: this process's task in a multi-worker job ('worker:1'); '' on one
      host.
    is_chief: whether this process writes checkpoints, summaries and
      params.txt (always on one host).
    input_device: for a layout over other hosts' devices (``OnCluster``):
      where the input is read and every global batch is cut into the
      replicas' shares, the trainer's CPU; '' otherwise (the strategy
      places each replica's input).
  """
  devices_per_replica: int
  devices: tuple[tuple[str, ...], ...]
  task: str = ''
  is_chief: bool = True
  input_device: str = ''

  @property
  def num_replicas(self) -> int:
    """R."""
    return len(self.devices)

  @property
  def strategy_devices(self) -> list[str]:
    """The first device of each replica: where its variables live."""
    return [row[0] for row in self.devices if row]

  @classmethod
  def Plan(cls, num_replicas: int, num_cells: int,
           all_devices: Sequence[str] | None = None) -> ReplicaLayout:
    """R replicas x K cells on one host: replica r on devices rK .. rK+K-1.

    Args:
      num_replicas: R; 0 for as many as fit (``NumReplicasThatFit``).
      num_cells: K, the cells per replica.
      all_devices: the devices to cut into replica groups; default
        ``devices.DefaultDevices()``.

    Raises:
      ReplicaLayoutError: R > 1 and fewer than R x K devices, R < 0 or K < 1.
    """
    if num_cells < 1:
      raise ReplicaLayoutError(f'num_cells must be >= 1, got {num_cells}.')
    if num_replicas < 0:
      raise ReplicaLayoutError(
          f'num_replicas must be >= 0 (0: as many as fit), got '
          f'{num_replicas}.')
    all_devices = list(all_devices or devices_lib.DefaultDevices())
    if num_replicas == 0:
      num_replicas = NumReplicasThatFit(num_cells, all_devices)
    if num_replicas > 1 and num_replicas * num_cells > len(all_devices):
      raise ReplicaLayoutError(
          f'{num_replicas} replicas x {num_cells} cells need '
          f'{num_replicas * num_cells} devices but there are '
          f'{len(all_devices)} ({all_devices}); lower num_replicas or '
          'num_partitions, or add logical devices (--num_logical_devices).')
    return cls(num_cells, tuple(
        tuple(all_devices[r * num_cells:(r + 1) * num_cells])
        for r in range(num_replicas)))

  @classmethod
  def OnCluster(cls, devices: Sequence[Sequence[str]],
                input_device: str) -> ReplicaLayout:
    """R replicas on other hosts' devices, driven in-graph by this process.

    Args:
      devices: devices[r][k], fully qualified (e.g. from
        pipeline_cluster.ReplicaPipelineDevices), every row of K devices.
      input_device: this process's CPU, where global batches are split.

    Raises:
      ReplicaLayoutError: rows of different lengths, an empty row, or a
        device used twice.
    """
    rows = tuple(tuple(row) for row in devices)
    if not rows or not rows[0] or len({len(row) for row in rows}) != 1:
      raise ReplicaLayoutError(
          f'Every replica needs the same number (>= 1) of cell devices, got '
          f'{[list(row) for row in rows]}.')
    flat = [d for row in rows for d in row]
    if len(set(flat)) != len(flat):
      raise ReplicaLayoutError(
          f'A device hosts cells of two replicas in {flat}; give every cell '
          'a device of its own.')
    return cls(len(rows[0]), rows, input_device=input_device)

  @classmethod
  def FromStrategy(cls, strategy: tf.distribute.Strategy | None,
                   num_cells: int) -> ReplicaLayout:
    """The layout `strategy` implies (None: one replica, no strategy).

    A strategy made by ``MakeStrategy`` of an ``OnCluster`` layout: that
    layout. On one host: ``Plan`` for the strategy's replicas. Multi-worker: every
    task is one replica on its own first K devices of the strategy's kind
    (GPU or CPU), as TensorFlow lists them once the cluster is up
    (``WorkerGroups``).

    Raises:
      ReplicaLayoutError: too few devices.
    """
    if strategy is None:
      return cls.Plan(1, num_cells)
    laid_out = _CLUSTER_LAYOUTS.get(strategy)
    if laid_out is not None:
      if laid_out.devices_per_replica != num_cells:
        raise ReplicaLayoutError(
            f'The strategy was made for {laid_out.devices_per_replica} cells '
            f'per replica, but the model has {num_cells}.')
      return laid_out
    if not cluster.IsMultiWorker(strategy):
      return cls.Plan(strategy.num_replicas_in_sync, num_cells)
    kind = tf.DeviceSpec.from_string(
        strategy.extended.worker_devices[0]).device_type
    names = [d.name for d in tf.config.list_logical_devices(kind)]
    groups = WorkerGroups(cluster.StrategyTaskOrder(strategy), names,
                          num_cells)
    return cls(num_cells, tuple(tuple(g) for g in groups),
               task=cluster.TaskName(strategy),
               is_chief=cluster.IsChief(strategy))

  def MakeStrategy(self) -> tf.distribute.MirroredStrategy | None:
    """A MirroredStrategy over ``strategy_devices``; None for one replica.

    On CPU devices the strategy reduces through one device
    (ReductionToOneDevice) instead of collective ops.

    An ``OnCluster`` layout gets an in-graph MirroredStrategy over the
    workers' devices: this process drives every replica, no collective ops
    (TensorFlow cannot enable them together with remote execution). Its
    cross-replica sums run on replica 0's strategy device
    (ReductionToOneDevice(reduce_to_device=that device)): the other
    replicas' values travel there and back, replica 0's stay put, and the
    trainer's CPU carries no gradient traffic. TensorFlow refuses to build a
    MirroredStrategy over several remote tasks while executing eagerly
    ("In-graph multi-worker training with `MirroredStrategy` is not supported
    in eager mode"), although its in-graph path with ReductionToOneDevice
    works in tf.functions; so that strategy is built under a throwaway
    tf.Graph (its constructor runs no op).

    Raises:
      ReplicaLayoutError: a multi-worker layout (its strategy is made at
        start-up: cluster.MakeMultiWorkerStrategy).
    """
    if self.task:
      raise ReplicaLayoutError(
          f'The layout of task {self.task} belongs to a multi-worker job; '
          'make its strategy with cluster.MakeMultiWorkerStrategy.')
    if self.num_replicas == 1:
      return None
    if self.input_device:
      reduce_to = tf.distribute.ReductionToOneDevice(
          reduce_to_device=self.strategy_devices[0])
      with tf.Graph().as_default():  # See above: not while eager.
        strategy = tf.distribute.MirroredStrategy(self.strategy_devices,
                                                  cross_device_ops=reduce_to)
      _CLUSTER_LAYOUTS[strategy] = self
      return strategy
    cross_device_ops = None  # NCCL (or the strategy's default) on GPUs.
    if all(tf.DeviceSpec.from_string(d).device_type == 'CPU'
           for d in self.strategy_devices):
      # Not collectives: their group keys are process-wide, so a second
      # strategy over other CPU devices in the same process would collide
      # with the first ("joining a group that is already full").
      cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(self.strategy_devices,
                                          cross_device_ops=cross_device_ops)

  def Describe(self) -> list[str]:
    """Lines for a log: R x K, this task, and every replica's cell devices."""
    lines = [f'{self.num_replicas} replicas x {self.devices_per_replica} '
             'cells per replica.']
    if self.task:
      lines.append(f'This is task {self.task}' + (
          ' (chief: writes checkpoints, summaries, params.txt).'
          if self.is_chief else '.'))
    if self.input_device:
      lines.append(f'Global batches are read and split on {self.input_device}'
                   '; gradients are summed on '
                   f'{self.strategy_devices[0]}.')
    for r, row in enumerate(self.devices):
      lines.append(f'Replica {r}: ' + ', '.join(
          f'cell {k} on {d}' for k, d in enumerate(row)))
    return lines


# The OnCluster layout each strategy was made from (ReplicaLayout.MakeStrategy).
_CLUSTER_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
  first K devices of this task (``ReplicaLayout.FromStrategy``), checked to
  be this task's own.

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
  laid_out = _CLUSTER_LAYOUTS.get(strategy)
  if all_devices is None and laid_out is not None:
    return list(ReplicaLayout.FromStrategy(strategy, num_cells)
                .devices[replica])
  if all_devices is None and cluster.IsMultiWorker(strategy):
    cells = list(ReplicaLayout.FromStrategy(strategy, num_cells)
                 .devices[replica])
    _CheckOnThisTask(strategy, cells)
    logging.info('Replica %d (task %s) pipelines on %s', replica,
                 cluster.TaskName(strategy), ', '.join(cells))
    return cells
  num_replicas = tf.distribute.get_replica_context().num_replicas_in_sync
  return list(ReplicaLayout.Plan(num_replicas, num_cells, all_devices)
              .devices[replica])


def ClusterReplicaDevices(first_replica: Sequence[str]) -> list[str] | None:
  """Devices of the current replica's cells, for a pipeline with explicit devices.

  Explicit PipeliningLayer devices are replica 0's cells. Under a strategy
  made from an ``OnCluster`` layout whose replica 0 runs on
  `first_replica`, replica r runs on that layout's row r; otherwise None
  (every replica runs on the explicit devices, as without a strategy).
  """
  replica = ReplicaId()
  if replica is None:
    return None
  laid_out = _CLUSTER_LAYOUTS.get(tf.distribute.get_strategy())
  if laid_out is None or list(laid_out.devices[0]) != list(first_replica):
    return None
  return list(laid_out.devices[replica])


def ReplicaInput(batch: Any) -> Any:
  """This replica's input, given what the step was called with.

  Under a strategy of an ``OnCluster`` layout the step gets whole global
  batches (``DistributeDataset`` leaves them on this process) and every
  replica cuts its ``ShareOfBatch`` on the layout's input device, so only
  its share crosses the network. Otherwise `batch` is already this
  replica's (the strategy split it).
  """
  laid_out = _CLUSTER_LAYOUTS.get(tf.distribute.get_strategy())
  replica = ReplicaId()
  if laid_out is None or replica is None:
    return batch
  with tf.device(laid_out.input_device):
    return ShareOfBatch(batch, replica, laid_out.num_replicas)


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


def NumReplicasThatFit(num_cells: int,
                       all_devices: Sequence[str] | None = None) -> int:
  """R that uses every device: len(devices) // K, at least 1.

  With fewer devices than K this is 1, and the pipeline itself then says that
  its cells do not fit (PartitionError).

  Raises:
    ReplicaLayoutError: num_cells < 1.
  """
  if num_cells < 1:
    raise ReplicaLayoutError(f'num_cells must be >= 1, got {num_cells}.')
  all_devices = list(all_devices or devices_lib.DefaultDevices())
  return max(1, len(all_devices) // num_cells)


def MakeStrategy(num_replicas: int, num_cells: int,
                 all_devices: Sequence[str] | None = None
                 ) -> tf.distribute.Strategy | None:
  """A MirroredStrategy for R x K devices: ``ReplicaLayout.Plan(...).MakeStrategy()``.

  Returns None for one replica (no strategy: the default one is used).

  Raises:
    ReplicaLayoutError: fewer than num_replicas * num_cells devices, or
      num_replicas < 1.
  """
  if num_replicas < 1:
    raise ReplicaLayoutError(f'num_replicas must be >= 1, got {num_replicas}.')
  return ReplicaLayout.Plan(num_replicas, num_cells, all_devices).MakeStrategy()


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
  global batch into R shares). A strategy of an ``OnCluster`` layout:
  `dataset` itself, read on this process (``ReplicaInput`` splits each global
  batch inside the step), so the workers never run the input pipeline.
  Multi-worker: every task builds the whole
  stream and keeps ``ShareOfBatch`` for its replica, so no task depends on
  file-level sharding and the split is the same whatever the input is.
  """
  if strategy in _CLUSTER_LAYOUTS:
    return dataset
  if not cluster.IsMultiWorker(strategy):
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
