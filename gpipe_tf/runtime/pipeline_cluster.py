"""Pipeline clusters: one trainer process drives a pipeline whose cells sit on other hosts' devices.

TensorFlow's own distributed runtime (remote eager execution over gRPC), no
collective ops and no strategy. A cluster has two jobs::

  chief  (1 task)   the trainer, the only process that runs Python: input,
                    loss, optimizer step, checkpoints and summaries
  worker (T tasks)  ``python -m gpipe_tf.runtime.serve_worker``: a
                    tf.distribute.Server that only hosts devices

After ``ConnectToCluster`` the trainer sees every worker's devices as
'/job:worker/replica:0/task:t/device:CPU:0' (or GPU:g), and
``PipelineDevices`` gives cell k of a K-cell PipeliningLayer one of them,
cells spread over the tasks in order, contiguous blocks, larger blocks
first (K=5 over T=2 tasks)::

  worker 0:  cell 0 -> CPU:0   cell 1 -> CPU:1   cell 2 -> CPU:2
  worker 1:  cell 3 -> CPU:0   cell 4 -> CPU:1

So only cell boundaries cross hosts; with K <= T every cell has a host of
its own. A worker uses its GPUs if it has any, else its CPU devices (split
with ``serve_worker --num_logical_devices``).

Failures. TensorFlow's remote calls have no deadline, so a worker that is
stopped or unreachable would hang the trainer: ``ConnectToCluster`` waits
for the workers with a deadline, ``FailedWorker`` names the worker behind an
error raised by a step, and gpipe_tf.runtime.worker_health has the health
checks, the background monitor and the one-line messages.

Data parallelism on top: ``ReplicaPipelineDevices`` lays R replicas x K
cells out the same way (``AssignReplicaCells``: replica 0's cells first, in
contiguous blocks), and gpipe_tf.runtime.distribute.ReplicaLayout.OnCluster
makes the in-graph MirroredStrategy this one process drives (no collective
ops: TensorFlow cannot enable them together with remote execution).

Not supported (deliberately): a chief hosting cells, TF_CONFIG multi-worker
training tasks on top, and elasticity (a lost worker ends the run; restart it and
rerun the trainer, which resumes from its newest checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from typing import Mapping, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.runtime import worker_health

__all__ = ['AssignCells', 'AssignReplicaCells', 'CLIENT_JOB', 'CellLayoutError',
           'ConnectToCluster', 'FROM_ENVIRONMENT', 'FailedWorker',
           'ParseCluster', 'PipelineCluster', 'PipelineClusterError',
           'PipelineDevices', 'ReplicaPipelineDevices', 'SERVE_COMMAND',
           'WORKER_JOB', 'WorkerDevices', 'WorkerNamedIn']

CLIENT_JOB = 'chief'
WORKER_JOB = 'worker'
FROM_ENVIRONMENT = 'TF_CONFIG'
SERVE_COMMAND = 'python -m gpipe_tf.runtime.serve_worker'


class PipelineClusterError(errors.Error, ValueError):
  """The cluster description is malformed or cannot host the pipeline."""


class CellLayoutError(PipelineClusterError):
  """The R x K cells do not fit the workers' devices."""


@dataclasses.dataclass(frozen=True)
class PipelineCluster:
  """A chief (this trainer) and its worker tasks, as 'host:port' addresses."""
  chief: str
  workers: tuple[str, ...]
  protocol: str = 'grpc'

  def Spec(self) -> tf.train.ClusterSpec:
    return tf.train.ClusterSpec({CLIENT_JOB: [self.chief],
                                 WORKER_JOB: list(self.workers)})

  def AsJson(self) -> str:
    return json.dumps({CLIENT_JOB: [self.chief],
                       WORKER_JOB: list(self.workers)}, separators=(',', ':'))

  @staticmethod
  def TaskName(index: int) -> str:
    return f'/job:{WORKER_JOB}/replica:0/task:{index}'

  def Describe(self, index: int) -> str:
    """'worker 1 (/job:worker/replica:0/task:1 at host:port)'."""
    return f'worker {index} ({self.TaskName(index)} at {self.workers[index]})'

  def ServeCommand(self, index: int) -> str:
    """The command that (re)starts worker `index` on its host."""
    return f"{SERVE_COMMAND} --cluster='{self.AsJson()}' --task_index={index}"

  @property
  def client_device(self) -> str:
    """The trainer's CPU, where checkpoints are read and written."""
    return f'/job:{CLIENT_JOB}/replica:0/task:0/device:CPU:0'


def ParseCluster(value: str,
                 environ: Mapping[str, str] | None = None) -> PipelineCluster:
  """The pipeline cluster a flag value describes.

  Args:
    value: JSON text or the path of a JSON file, either a cluster
      '{"chief": ["host:port"], "worker": ["host:port", ...]}' or a whole
      TF_CONFIG ('{"cluster": {...}, "task": {...}}'); or 'TF_CONFIG' to
      read that environment variable. A TF_CONFIG's task, if any, must be
      the chief's (this is the trainer) or a worker's (a serve_worker).
    environ: where TF_CONFIG is read; default os.environ.

  Raises:
    PipelineClusterError: saying what is wrong and what to write instead.
  """
  text, origin = value.strip(), '--pipeline_cluster'
  if text.upper() == FROM_ENVIRONMENT:
    text = (os.environ if environ is None else environ).get(
        FROM_ENVIRONMENT, '').strip()
    origin = FROM_ENVIRONMENT
    if not text:
      raise PipelineClusterError(
          'TF_CONFIG is empty; set it to {"cluster": {"chief": ["host:port"], '
          '"worker": [...]}, "task": {...}} or pass the cluster JSON itself.')
  elif not text.startswith('{'):
    if not os.path.isfile(text):
      raise PipelineClusterError(
          f'{origin}={value!r} is neither JSON nor an existing file; pass '
          '\'{"chief": ["host:port"], "worker": ["host:port", ...]}\', a file '
          'holding it, or TF_CONFIG.')
    origin = text
    with open(text) as f:
      text = f.read()
  try:
    config = json.loads(text)
  except ValueError as e:
    raise PipelineClusterError(f'{origin} is not valid JSON ({e}).') from e
  if not isinstance(config, dict):
    raise PipelineClusterError(f'{origin} must be a JSON object.')
  cluster = config.get('cluster', config)
  task = config.get('task')
  if task is not None and (not isinstance(task, dict) or task.get('type') not in
                           (CLIENT_JOB, WORKER_JOB)):
    raise PipelineClusterError(
        f'{origin} names task {task!r}; a pipeline cluster has only '
        f'"{CLIENT_JOB}" (the trainer, index 0) and "{WORKER_JOB}" tasks.')
  if not isinstance(cluster, dict):
    raise PipelineClusterError(f'{origin}: "cluster" must be a JSON object.')
  extra = sorted(set(cluster) - {CLIENT_JOB, WORKER_JOB})
  if extra:
    raise PipelineClusterError(
        f'{origin} has jobs {extra}; a pipeline cluster has only '
        f'"{CLIENT_JOB}" (the trainer) and "{WORKER_JOB}" (hosts of cells).')
  chief, workers = cluster.get(CLIENT_JOB), cluster.get(WORKER_JOB)
  if not (isinstance(chief, list) and len(chief) == 1):
    raise PipelineClusterError(
        f'{origin} needs exactly one "{CLIENT_JOB}" address, the trainer\'s '
        'host:port (the workers connect back to it), got '
        f'{chief!r}.')
  if not (isinstance(workers, list) and workers):
    raise PipelineClusterError(
        f'{origin} needs a non-empty "{WORKER_JOB}" list of host:port '
        f'addresses, got {workers!r}.')
  for address in chief + workers:
    if not (isinstance(address, str) and re.fullmatch(r'[^\s:]+:\d+|\[.+\]:\d+',
                                                      address)):
      raise PipelineClusterError(
          f'{origin}: {address!r} is not a host:port address.')
  return PipelineCluster(chief[0], tuple(workers),
                         config.get('rpc_layer') or 'grpc')


def ConnectToCluster(cluster: PipelineCluster,
                     timeout_seconds: float = 60.0,
                     worker_inter_op_threads: int | None = None) -> list[str]:
  """Makes this process the cluster's chief; returns every device it sees.

  Must run before TensorFlow runs any op. `worker_inter_op_threads`: how
  many ops each worker runs at once for this process. TensorFlow sizes a
  worker's pool for a chief's ops from the chief's configuration, not from
  the worker's own (serve_worker --inter_op_threads sizes only its server's
  pool), and a chief that sets none leaves each worker one thread per core
  it may use: one for a worker pinned to a core, whose sends then wait
  until its compute runs out of work (docs/cross-host.md). Set, it becomes
  this process's inter-op setting too (a chief that only drives the step
  uses few). None leaves this process's setting as it is. Waits for the workers
  (``worker_health.WaitForWorkers``), then connects
  (tf.config.experimental_connect_to_cluster) with a ClusterSpec rather than
  a resolver, so ops without a device
  stay on this process's own devices (the input pipeline, the loss, the
  non-pipelined layers) and only the cells go remote.

  Returns:
    Every device name, this process's and the workers', fully qualified.

  Raises:
    worker_health.WorkerUnreachableError: a worker did not accept
      connections, or connecting did not finish, within `timeout_seconds`.
    PipelineClusterError: this process cannot listen on the chief address.
  """
  start = time.monotonic()
  if worker_inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(
        worker_inter_op_threads)
  worker_health.WaitForWorkers(cluster, timeout_seconds)
  tf.config.experimental_connect_to_cluster(
      cluster.Spec(), job_name=CLIENT_JOB, task_index=0,
      protocol=cluster.protocol)
  outcome: dict[str, object] = {}

  def _Connect():  # Creating the context contacts every worker.
    try:
      outcome['devices'] = [d.name for d in tf.config.list_logical_devices()]
    except Exception as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=_Connect, daemon=True)
  thread.start()
  thread.join(max(timeout_seconds - (time.monotonic() - start), 1.0))
  if thread.is_alive():
    raise worker_health.WorkerUnreachableError(
        f'Connecting to the workers {list(cluster.workers)} did not finish '
        f'within {timeout_seconds:g} s although every one accepts '
        'connections: is a worker process stopped, or another program on its '
        'port? Restart the workers (' + '; '.join(
            cluster.ServeCommand(i) for i in range(len(cluster.workers)))
        + ').')
  error = outcome.get('error')
  if isinstance(error, tf.errors.UnknownError) and 'gRPC server' in str(error):
    raise PipelineClusterError(
        f'Cannot listen on the chief address {cluster.chief}: is the port in '
        'use (another trainer still running?) or the host not this one? Put '
        'a free port of this host under "chief".') from error
  if error is not None:
    raise error
  return list(outcome['devices'])


def AssignCells(num_cells: int,
                task_devices: Sequence[Sequence[str]]) -> list[str]:
  """Pure: the device of each of K cells over T tasks' device lists.

  Task t takes a contiguous block of K // T cells (one more for the first
  K % T tasks), on its devices 0, 1, ... in order (``AssignReplicaCells``
  with one replica).

  Raises:
    CellLayoutError: a task has fewer devices than its block of cells.
  """
  return AssignReplicaCells(1, num_cells, task_devices)[0]


def AssignReplicaCells(num_replicas: int, num_cells: int,
                       task_devices: Sequence[Sequence[str]]
                       ) -> list[list[str]]:
  """Pure: devices[r][k], the device of cell k of replica r, over T tasks.

  The R x K cells, replica 0's first, are cut into T contiguous blocks
  (RK // T cells, one more for the first RK % T tasks), task t's on its
  devices 0, 1, ... in order. So each replica's cells sit on as few tasks as
  possible, next to each other, and only cell boundaries and the gradient
  all-reduce cross hosts (R=2, K=2 over 2 tasks of 2 devices; over 4 tasks
  of 1)::

    task 0: replica 0 cells 0,1 -> 0,1     task 0: replica 0 cell 0 -> 0
    task 1: replica 1 cells 0,1 -> 0,1     task 1: replica 0 cell 1 -> 0
                                           task 2: replica 1 cell 0 -> 0
                                           task 3: replica 1 cell 1 -> 0

  Raises:
    CellLayoutError: a task has fewer devices than its block of cells (the
      message says which --num_logical_devices, or how many workers, fit),
      or R < 1, K < 1, T = 0.
  """
  if num_cells < 1:
    raise CellLayoutError(f'num_cells must be >= 1, got {num_cells}.')
  if num_replicas < 1:
    raise CellLayoutError(f'num_replicas must be >= 1, got {num_replicas}.')
  num_tasks = len(task_devices)
  if not num_tasks:
    raise CellLayoutError('The cluster has no worker devices.')
  total = num_replicas * num_cells
  blocks = [total // num_tasks + (t < total % num_tasks)
            for t in range(num_tasks)]
  flat = []
  for t, (block, own) in enumerate(zip(blocks, task_devices)):
    if block > len(own):
      raise CellLayoutError(_DoesNotFit(num_replicas, num_cells, t, block,
                                        task_devices))
    flat.extend(own[:block])
  return [flat[r * num_cells:(r + 1) * num_cells]
          for r in range(num_replicas)]


def _DoesNotFit(num_replicas: int, num_cells: int, task: int, block: int,
                task_devices: Sequence[Sequence[str]]) -> str:
  """Why R x K cells do not fit, and what would."""
  total, num_tasks = num_replicas * num_cells, len(task_devices)
  own = list(task_devices[task])
  what = (f'{num_cells} cells' if num_replicas == 1 else
          f'{num_replicas} replicas x {num_cells} cells = {total} cells')
  fewest = min(len(d) for d in task_devices)
  workers = (f'use {-(-total // fewest)} workers of {fewest} devices each'
             if fewest and num_replicas > 1 else
             f'add workers (up to {total})')
  lower = ('lower --num_replicas or num_partitions' if num_replicas > 1
           else 'lower num_partitions')
  return (f'{what} over {num_tasks} workers put {block} cells on worker '
          f'{task}, which has {len(own)} devices ({own}); start each worker '
          f'with --num_logical_devices={block} (CPU hosts), {workers}, or '
          f'{lower}.')


def WorkerDevices(cluster: PipelineCluster,
                  device_names: Sequence[str] | None = None
                  ) -> list[list[str]]:
  """Each worker task's devices: its GPUs if it has any, else its CPUs.

  Args:
    device_names: fully qualified names; default every logical device
      TensorFlow lists (after ``ConnectToCluster``).
  """
  if device_names is None:
    device_names = [d.name for d in tf.config.list_logical_devices()]
  specs = [(n, tf.DeviceSpec.from_string(n)) for n in device_names]
  out = []
  for t in range(len(cluster.workers)):
    own = [(s.device_type, s.device_index or 0, n) for n, s in specs
           if s.job == WORKER_JOB and (s.task or 0) == t]
    kind = 'GPU' if any(k == 'GPU' for k, _, _ in own) else 'CPU'
    out.append([n for _, _, n in sorted(x for x in own if x[0] == kind)])
  return out


def PipelineDevices(num_cells: int, cluster: PipelineCluster,
                    device_names: Sequence[str] | None = None) -> list[str]:
  """The device of each cell of a K-cell pipeline on the cluster's workers.

  See the module docstring for the layout (``AssignCells``).

  Raises:
    CellLayoutError: the workers have too few devices.
  """
  return AssignCells(num_cells, WorkerDevices(cluster, device_names))


def ReplicaPipelineDevices(num_replicas: int, num_cells: int,
                           cluster: PipelineCluster,
                           device_names: Sequence[str] | None = None
                           ) -> list[list[str]]:
  """devices[r][k] of R replicas of a K-cell pipeline on the workers.

  See ``AssignReplicaCells`` for the layout.

  Raises:
    CellLayoutError: the workers have too few devices.
  """
  return AssignReplicaCells(num_replicas, num_cells,
                            WorkerDevices(cluster, device_names))


def WorkerNamedIn(cluster: PipelineCluster,
                  error: BaseException) -> int | None:
  """Pure: the index of the worker whose task name or address `error` names."""
  text = str(error)
  match = re.search(rf'/job:{WORKER_JOB}/replica:\d+/task:(\d+)', text)
  if match and int(match.group(1)) < len(cluster.workers):
    return int(match.group(1))
  for i, address in enumerate(cluster.workers):
    if address in text:
      return i
  return None


def FailedWorker(cluster: PipelineCluster, error: BaseException,
                 timeout_seconds: float = 5.0) -> int | None:
  """The worker behind `error` (raised by a remote call), or None if unknown.

  The first worker that fails a health check (``ProbeWorker``) is the
  answer: the error may name a live worker that was waiting for the dead
  one. If every worker answers, the worker the error names.
  """
  for i in range(len(cluster.workers)):
    if worker_health.ProbeWorker(cluster, i, timeout_seconds) is not None:
      return i
  return WorkerNamedIn(cluster, error)
