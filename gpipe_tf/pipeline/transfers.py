"""What a step's graph moves between devices: per pair of devices, the tensors ops on one read from ops on the other.

Read off a traced graph (``tf.function(...).get_concrete_function().graph``)
before TensorFlow places it: every data edge whose producer and consumer
ops ask for different devices is a transfer the runtime makes (a Send/Recv
pair once partitioned). Built with ``execution='unrolled'`` every step is in
that graph, so each transfer is counted once per time it happens; a loop's
body (the other executions) would be counted once for all its iterations, so
``Edges`` refuses a graph with loops. Function bodies are not entered: a
cell's piece is one call op on its device, and what it reads from another
device is among its inputs.
"""

from __future__ import annotations

import collections
import dataclasses
import tensorflow as tf

__all__ = ['ByPair', 'DeviceKey', 'Edge', 'Edges', 'ReceivedBytes']


@dataclasses.dataclass(frozen=True)
class Edge:
  """One tensor read across devices.

  Attributes:
    src: the device that makes it (canonical name).
    dst: the device that reads it.
    shape: its static shape (a tuple; None for an unknown dimension).
    dtype: its dtype name.
    num_bytes: its size, 0 where the shape is not fully known or the dtype
      has no fixed size (resources, variants).
  """
  src: str
  dst: str
  shape: tuple
  dtype: str
  num_bytes: int


def DeviceKey(device: str) -> str:
  """How Edges names a device: 'CPU:1' for a device of this process, with
  the job and task in front for another process's ('/job:worker/task:1/CPU:0')."""
  spec = tf.DeviceSpec.from_string(device)
  mine = spec.job in (None, 'localhost')
  where = '' if mine else f'/job:{spec.job}/task:{spec.task or 0}/'
  return f'{where}{spec.device_type or "?"}:{spec.device_index or 0}'


def _Bytes(t: tf.Tensor) -> int:
  if not t.shape.is_fully_defined() or t.dtype in (tf.resource, tf.variant,
                                                   tf.string):
    return 0
  return int(t.shape.num_elements()) * t.dtype.size


def Edges(graph: tf.Graph) -> list[Edge]:
  """Every data edge of `graph` between ops placed on different devices
  (ops without a device are skipped: they go where their inputs are).

  Raises:
    ValueError: the graph holds a loop (build the step unrolled).
  """
  edges = []
  for op in graph.get_operations():
    if op.type in ('While', 'StatelessWhile'):
      raise ValueError(
          'transfers.Edges counts a loop body once for all its iterations; '
          "trace the step with execution='unrolled'.")
    if not op.device:
      continue
    dst = DeviceKey(op.device)
    for t in op.inputs:
      if not t.op.device:
        continue
      src = DeviceKey(t.op.device)
      if src != dst:
        edges.append(Edge(src, dst, tuple(t.shape.as_list())
                          if t.shape.rank is not None else (), t.dtype.name,
                          _Bytes(t)))
  return edges


def ReceivedBytes(graph: tf.Graph, min_rank: int = 1) -> dict[str, int]:
  """Per device, the bytes of the tensors of rank >= `min_rank` its ops
  read from other devices (scalars, the steps' ordering tokens and the
  loss scale, are left out by default)."""
  out: dict[str, int] = collections.defaultdict(int)
  for e in Edges(graph):
    if len(e.shape) >= min_rank:
      out[e.dst] += e.num_bytes
  return dict(out)


def ByPair(graph: tf.Graph, min_rank: int = 1) -> dict[tuple, list]:
  """{(src, dst): [shape of each tensor of rank >= min_rank read]}."""
  out: dict[tuple, list] = collections.defaultdict(list)
  for e in Edges(graph):
    if len(e.shape) >= min_rank:
      out[(e.src, e.dst)].append(e.shape)
  return dict(out)

