"""Data parallelism over pipelines: R replicas of a K-cell pipeline on one host.

Layout of R x K devices (the logical CPU devices, or the GPUs)::

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

This module deliberately does NOT handle several hosts
(MultiWorkerMirroredStrategy); see TF-NOTES for how that is set up.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from gpipe_tf import devices as devices_lib


class ReplicaLayoutError(ValueError):
  """R replicas x K cells do not fit the devices there are."""


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

  Args:
    num_cells: K, the cells per replica.
    all_devices: the devices to cut into replica groups; default
      ``devices.DefaultDevices()``.

  Raises:
    ReplicaLayoutError: fewer than R*K devices.
  """
  replica = ReplicaId()
  if replica is None:
    return None
  num_replicas = tf.distribute.get_replica_context().num_replicas_in_sync
  all_devices = list(all_devices or devices_lib.DefaultDevices())
  _CheckFits(num_replicas, num_cells, all_devices)
  return all_devices[replica * num_cells:(replica + 1) * num_cells]


def _CheckFits(num_replicas: int, num_cells: int,
               all_devices: Sequence[str]) -> None:
  if num_replicas * num_cells > len(all_devices):
    raise ReplicaLayoutError(
        f'{num_replicas} replicas x {num_cells} cells need '
        f'{num_replicas * num_cells} devices but there are {len(all_devices)} '
        f'({list(all_devices)}); lower num_replicas or num_partitions, or add '
        'logical devices (--num_logical_devices).')


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
