"""Finding accelerators, and splitting a CPU into logical devices that stand in for them."""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from gpipe_tf import errors

__all__ = ['ConfigureCpuSplit', 'DefaultDevices', 'DeviceConfigError',
           'LogicalCpus', 'SplitCpu']


class DeviceConfigError(errors.Error, RuntimeError):
  """Logical devices were requested after TensorFlow had already started."""


def SplitCpu(num_devices: int, intra_op_threads: int | None = None,
             inter_op_threads: int | None = None) -> list[str]:
  """Splits the physical CPU into `num_devices` logical CPU devices.

  Emulates `num_devices` accelerators on a CPU host: every logical device is a
  placement label over one shared thread pool and allocator, so each is given
  its share of the cores (intra-op threads = cores // num_devices) and enough
  inter-op threads to run all of them at once (docs/tensorflow-notes.md).

  The CPU is also switched to TensorFlow's BFC allocator (the one GPUs use),
  unless TF_CPU_ALLOCATOR_USE_BFC is already set: TF 2.21's default CPU
  allocator keeps no statistics, so without it
  ``tf.config.experimental.get_memory_info('CPU:0')`` raises and peak memory
  cannot be measured.

  Must run before TensorFlow executes any op. Calling it again with the same
  number of devices is a no-op.

  Returns:
    The logical device names, e.g. ['/device:CPU:0', '/device:CPU:1'].

  Raises:
    DeviceConfigError: TensorFlow already initialised with another layout.
  """
  ConfigureCpuSplit(num_devices, intra_op_threads, inter_op_threads)
  return LogicalCpus()


def ConfigureCpuSplit(num_devices: int, intra_op_threads: int | None = None,
                      inter_op_threads: int | None = None) -> None:
  """SplitCpu without starting TensorFlow: configures, lists nothing.

  For a program that must configure something else at start-up after the
  split, e.g. a MultiWorkerMirroredStrategy (its collective ops must be
  configured before TensorFlow starts, and listing devices starts it).
  """
  if num_devices < 1:
    raise ValueError(f'num_devices must be >= 1, got {num_devices}.')
  cpus = tf.config.list_physical_devices('CPU')
  existing = tf.config.get_logical_device_configuration(cpus[0])
  if existing is not None and len(existing) == num_devices:
    return
  cores = os.cpu_count() or 1
  # Read when the CPU allocator is first created, i.e. at the first op.
  os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  try:
    if num_devices > 1:
      tf.config.set_logical_device_configuration(
          cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
    tf.config.threading.set_intra_op_parallelism_threads(
        intra_op_threads or max(1, cores // num_devices))
    tf.config.threading.set_inter_op_parallelism_threads(
        inter_op_threads or max(2, num_devices))
  except RuntimeError as e:
    raise DeviceConfigError(
        f'Cannot split the CPU into {num_devices} devices after TensorFlow has '
        'started; call gpipe_tf.runtime.devices.SplitCpu before running any '
        f'op (the trainer does it at start-up). ({e})') from e


def LogicalCpus() -> list[str]:
  return [d.name for d in tf.config.list_logical_devices('CPU')]


def DefaultDevices() -> list[str]:
  """All GPUs, else all TPU cores, else all logical CPU devices.

  In a multi-worker cluster (MultiWorkerMirroredStrategy) TensorFlow also
  lists the other workers' devices; only this process's are returned. Devices
  of a kind that are all remote (e.g. TPU cores of a connected TPU worker) are
  returned as listed.
  """
  host = tf.DeviceSpec.from_string(context.context().host_address_space())
  for kind in ('GPU', 'TPU', 'CPU'):
    found = [d.name for d in tf.config.list_logical_devices(kind)]
    local = [d for d in found if _OnHost(d, host)]
    if local or found:
      return local or found
  raise DeviceConfigError('TensorFlow sees no device at all.')


def _OnHost(device: str, host: tf.DeviceSpec) -> bool:
  """Whether `device` belongs to the process whose address space is `host`."""
  spec = tf.DeviceSpec.from_string(device)
  return (spec.job in (None, host.job) and spec.replica in (None, host.replica)
          and spec.task in (None, host.task))
