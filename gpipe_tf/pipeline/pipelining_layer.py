"""PipeliningLayer: GPipe over a sequence of layers, K cells on K devices, M micro-batches."""

from __future__ import annotations

from typing import Sequence


from gpipe_tf.runtime import devices as devices_lib
from gpipe_tf.runtime import distribute
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.pipeline import cost as cost_lib
from gpipe_tf.pipeline import engine
from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline import schedule as schedule_lib

REMAT_POLICIES = ('always', 'except_last', 'never')


class PipeliningLayer(base_layer.BaseLayer):
  """Runs a sequence of L layers as a K-cell pipeline over M micro-batches.

  The user's interface is the list of layer Params (exactly what
  SequentialLayer takes), ``num_partitions`` (K) and ``num_micro_batches`` (M).
  The layers are cut into K contiguous cells balanced by a cost estimate (or an
  explicit ``balance``); cell k's variables are created on device k and its
  forward and backward ops run there. Each mini-batch is split into M
  micro-batches that flow through the cells in the GPipe fill-drain order::

      cell 0  F0 F1 F2 F3                   B3 B2 B1 B0
      cell 1     F0 F1 F2 F3             B3 B2 B1 B0
      cell 2        F0 F1 F2 F3       B3 B2 B1 B0
                   (bubble fraction (K-1)/(M+K-1))

  In training, activations inside a cell are recomputed in the backward pass
  (``remat``) and the gradients of all micro-batches are summed, so a step
  equals the step of the unpipelined SequentialLayer on the same weights,
  whatever K and M are (layers whose forward depends on the batch split, such
  as BatchNorm with per-micro-batch statistics, excepted).

  Variables are tracked as ``self.layers`` like SequentialLayer's, with the
  same variable paths, so checkpoints move between a SequentialLayer and a
  PipeliningLayer of any K and M.

  It does NOT compute the loss inside the pipeline; hence schedules that
  interleave forwards and backwards (1F1B) are not runnable yet.

  After construction, ``balance`` (layers per cell) and ``devices`` (one
  device string per cell) tell where everything went.

  Under a tf.distribute strategy with R > 1 replicas (gpipe_tf.runtime.distribute)
  and without explicit ``devices``, replica r runs cell k on device r*K + k
  of the default devices (``ReplicaDevices``); ``devices`` then names the
  cells of replica 0.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layers', [], 'The L layers, a list of layer Params, in order.')
    p.Define('num_partitions', 1, 'K: number of cells (one per device).')
    p.Define('balance', None,
             'Optional list of K layer counts per cell; overrides the cost '
             'estimator.')
    p.Define('num_micro_batches', 1,
             'M: micro-batches per mini-batch (M >= 4K makes the bubble '
             'negligible).')
    p.Define('remat', 'except_last',
             "Recompute policy: 'always', 'except_last' (skip the last "
             "micro-batch, whose backward directly follows its forward), "
             "'never'.")
    p.Define('devices', None,
             'Optional list of device strings; default: all GPUs, else TPU '
             'cores, else the logical CPU devices.')
    p.Define('cost', 'flops',
             "Layer cost for balancing: 'flops' (FPropMeta), 'params', or "
             "'profile' (forward + backward of each layer timed on a sample "
             'micro-batch, without the cost of calling a function).')
    p.Define('input_shapes', None,
             "Shapes of FProp's inputs for the 'flops' and 'profile' costs; "
             'the batch dimension may be None, or the mini-batch size N (then '
             "cost='profile' times N / num_micro_batches examples). Inferred "
             "from the first layer's input_dim when unset.")
    p.Define('profile_batch_size', None,
             "Examples per micro-batch that cost='profile' times each layer "
             "at (Lingvo's micro_batch_size; torchgpipe's balance_by_time "
             'sample): the training mini-batch / num_micro_batches, as layer '
             'costs do not scale alike with the batch. None: from a batch '
             'dimension in input_shapes, else 8.')
    p.Define('schedule', 'gpipe', "Pipeline schedule: 'gpipe' (fill-drain).")
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    p = self.p
    if not p.layers:
      raise ValueError(f"PipeliningLayer '{self.path}' has no layers.")
    if p.remat not in REMAT_POLICIES:
      raise ValueError(f"PipeliningLayer '{self.path}': unknown remat "
                       f'{p.remat!r}; use one of {REMAT_POLICIES}.')
    if p.num_micro_batches < 1:
      raise ValueError(f"PipeliningLayer '{self.path}': num_micro_batches "
                       f'must be >= 1, got {p.num_micro_batches}.')
    all_devices = list(p.devices) if p.devices else (
        devices_lib.DefaultDevices())
    self._balance = self._Balance(len(all_devices))
    self._devices = [all_devices[k] for k in range(len(self._balance))]
    per_layer = [d for d, n in zip(self._devices, self._balance)
                 for _ in range(n)]
    self.CreateChildren('layers', p.layers, devices=per_layer)
    self._schedule = schedule_lib.make_schedule(
        p.schedule, len(self._balance), p.num_micro_batches)
    self._CheckSchedule()
    self._cells = []
    start = 0
    for k, n in enumerate(self._balance):
      self._cells.append(engine.Cell(k, self.layers[start:start + n],
                                     self._devices[k]))
      start += n

  def _Balance(self, num_devices: int) -> list[int]:
    p = self.p
    num_layers = len(p.layers)
    if p.balance is not None:
      balance = partition.ValidateBalance(list(p.balance), num_layers,
                                           num_devices)
      if p.num_partitions not in (1, len(balance)):
        raise partition.PartitionError(
            f'balance {list(p.balance)} has {len(balance)} cells but '
            f'num_partitions={p.num_partitions}; make them agree.')
      return balance
    partition.CheckDevices(p.num_partitions, num_devices)
    if num_layers < p.num_partitions:
      # Let the partitioner raise its named error saying what would fit.
      return partition.PartitionBalanced([1.0] * num_layers,
                                          p.num_partitions)
    if p.num_partitions == 1:
      return [num_layers]
    costs = cost_lib.LayerCosts(p.layers, p.cost, p.input_shapes,
                                p.profile_batch_size, p.num_micro_batches)
    return partition.PartitionBalanced(costs, p.num_partitions)

  def _CheckSchedule(self) -> None:
    for k in range(len(self._balance)):
      kinds = [t.kind for t in self._schedule.order_for_cell(k)]
      if 'B' in kinds and 'F' in kinds[kinds.index('B'):]:
        raise NotImplementedError(
            f'Schedule {self.p.schedule!r} interleaves forward and backward '
            'passes; PipeliningLayer computes the loss after the pipeline and '
            "supports only fill-drain schedules ('gpipe').")

  @property
  def balance(self) -> list[int]:
    """Number of layers in each cell."""
    return list(self._balance)

  @property
  def devices(self) -> list[str]:
    """The device of each cell."""
    return list(self._devices)

  @property
  def schedule(self) -> schedule_lib.Schedule:
    return self._schedule

  def _Remat(self, k: int, m: int) -> bool:
    del k
    if self.p.remat == 'always':
      return True
    if self.p.remat == 'never':
      return False
    return m != self.p.num_micro_batches - 1

  def FProp(self, *inputs, training=False, trace=None):
    """Runs the pipeline. `trace`: an optional trace.ScheduleTrace."""
    return engine.RunPipeline(self._ReplicaCells(), self._schedule,
                              self._Remat, inputs, training, trace)

  def _ReplicaCells(self) -> list[engine.Cell]:
    """The cells, placed on this replica's devices when data-parallel."""
    if self.p.devices:
      return self._cells
    replica_devices = distribute.ReplicaDevices(len(self._cells))
    if replica_devices is None:
      return self._cells
    return [engine.Cell(c.index, c.layers, d)
            for c, d in zip(self._cells, replica_devices)]

  @classmethod
  def NumDevicesOf(cls, params) -> int:
    """K, the devices one replica of a model built from `params` pipelines over.

    The one place that answers "how many devices does this model need per
    replica": the length of an explicit ``balance``, else ``num_partitions``
    for Params of a PipeliningLayer (or subclass), and 1 for any other layer
    (or None). Pure Python: nothing is built.
    """
    if params is None or not isinstance(params.cls, type) or not issubclass(
        params.cls, cls):
      return 1
    if params.balance is not None:
      return len(params.balance)
    return int(params.num_partitions)

  @classmethod
  def FPropMeta(cls, p, *shapes):
    metas = core.MetaOfSequence(list(p.layers), shapes)
    return base_layer.LayerMeta(sum(m.flops for m in metas),
                                metas[-1].out_shapes,
                                sum(m.num_params for m in metas))

  @classmethod
  def CellMetas(cls, p, num_partitions: int | None = None,
                input_shapes: Sequence | None = None) -> list:
    """Per-cell (num_layers, num_params, flops) for planning, without building."""
    shapes = input_shapes or p.input_shapes or cost_lib.InferInputShapes(
        p.layers)
    metas = core.MetaOfSequence(list(p.layers), shapes)
    k = num_partitions or p.num_partitions
    balance = (partition.ValidateBalance(list(p.balance), len(metas))
               if p.balance is not None and num_partitions is None else
               partition.PartitionBalanced(
                   [float(m.flops) for m in metas], k))
    out, start = [], 0
    for n in balance:
      cell = metas[start:start + n]
      out.append({'num_layers': n,
                  'num_params': sum(m.num_params for m in cell),
                  'flops': sum(m.flops for m in cell)})
      start += n
    return out
