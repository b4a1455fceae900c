"""PipeliningLayer: GPipe over a sequence of layers, K cells on K devices, M micro-batches."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Sequence

from absl import logging

from gpipe_tf.runtime import devices as devices_lib
from gpipe_tf.runtime import distribute
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import precision
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.layers import skips as skips_lib
from gpipe_tf.pipeline import auto_schedule
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import cell_program
from gpipe_tf.pipeline import cost as cost_lib
from gpipe_tf.pipeline import engine
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import periods

__all__ = ['EXECUTIONS', 'PipeliningLayer', 'REMAT_POLICIES']

EXECUTIONS = periods.EXECUTIONS
REMAT_POLICIES = ('always', 'except_last', 'never')


@functools.lru_cache(maxsize=32)
def _Registered(name: str, k: int, m: int, v: int) -> schedule_lib.Schedule:
  """schedule.Make, once per layout: balancing and the layer both need it,
  and building and validating a long schedule takes seconds."""
  return schedule_lib.Make(name, k, m, v)


def _InputShapes(p) -> Sequence | None:
  """``input_shapes``, else the first layer's own ``input_shapes`` Params
  (a KerasLayer's, which FromKeras sets)."""
  first = p.layers[0]
  if p.input_shapes is None and 'input_shapes' in first:
    return first.input_shapes
  return p.input_shapes


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

  ``schedule`` names the order of the work (gpipe_tf.pipeline.schedule):
  'gpipe' (above), '1f1b' (PipeDream-Flush: cell k holds at most K-k
  micro-batches' activations), 'interleaved_1f1b' (``num_virtual_stages`` V
  cells per device, a smaller bubble) and 'zb_h1' (zero-bubble: the backward
  split into input- and weight-gradient halves), or a ``Schedule`` object
  (e.g. loaded from CSV). ``FProp`` + a GradientTape trains with fill-drain
  schedules; every schedule trains through ``ComputeLossAndGradients``, which
  computes the loss of each micro-batch inside the pipeline.

  After construction, ``balance`` (layers per cell), ``devices`` (one device
  string per cell) and ``schedule`` tell where everything went. With V > 1
  there are K x V cells; cell s runs on device s % K.

  Under a tf.distribute strategy with R > 1 replicas (gpipe_tf.runtime.distribute)
  and without explicit ``devices``, replica r runs cell k on device r*K + k
  of the default devices (``ReplicaDevices``); ``devices`` then names the
  cells of replica 0. With explicit ``devices``, every replica runs on them,
  except under a strategy made from a cluster layout
  (``distribute.ReplicaLayout.OnCluster``, replica 0 on ``devices``), where
  replica r runs on the layout's row r (``ClusterReplicaDevices``).
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
    p.Define('remat', 'always',
             "Recompute policy. 'always' (the default): recompute every "
             'forward whose backward does not directly follow it on its '
             'device; the ones that do (Schedule.ForwardsFollowedByBackward: '
             "every micro-batch of 1f1b's last stage, gpipe's last "
             'micro-batch when V = 1) would rebuild the same activations at '
             "once, so keeping them costs no peak memory. 'except_last': as "
             "'always', and also keep the last micro-batch on every stage "
             "(torchgpipe's default; in a step folded into a loop each kept "
             'variant is a second copy of the forward and backward to build). '
             "'never': keep every forward's activations.")
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
             "from the first layer's input_shapes (KerasLayer) or input_dim "
             'when unset.')
    p.Define('profile_batch_size', None,
             "Examples per micro-batch that cost='profile' times each layer "
             "at (Lingvo's micro_batch_size; torchgpipe's balance_by_time "
             'sample): the training mini-batch / num_micro_batches, as layer '
             'costs do not scale alike with the batch. None: from a batch '
             'dimension in input_shapes, else 8.')
    p.Define('schedule', 'gpipe',
             "Pipeline schedule: a registered name ('gpipe', '1f1b', "
             "'interleaved_1f1b', 'zb_h1'; schedule.Names()), the path of a "
             "CSV file (ending in '.csv', schedule.Dump's format) or a "
             'schedule.Schedule, for K devices, M micro-batches and K x V '
             "cells; or 'auto': the balance, V (1 or 2) and the schedule "
             'chosen together on the simulated step from the layer costs '
             "(``cost``) within ``memory_budget`` (auto_schedule.py).")
    p.Define('memory_budget', None,
             "schedule='auto' only: bytes per device the chosen schedule may "
             "hold in the memory model (schedule.memory, weights included); "
             "None: what 1F1B holds on its fullest device.")
    p.Define('auto_activations', 'traced',
             "schedule='auto' only: what the memory model takes a layer to "
             "keep for its backward. 'traced': what it keeps, from a trace "
             "of each distinct layer's training step on a small batch "
             "(layer_bytes.py); 'outputs': its FPropMeta outputs (nothing "
             'is built; right for an FC layer, far under for a Transformer '
             'block).')
    p.Define('execution', 'loop',
             "How the step's graph is built (schedule.periods.Plan): 'loop' "
             "(every tick while the steps cost at most loop_budget ops, else "
             'its repeating stretches as tf.while_loops, else one '
             'tf.while_loop over the ticks with a tf.switch_case per stage: '
             'the step graph and its tracing stop growing with M), '
             "'folded' (repeats as while loops, whatever the budget), "
             "'switch' (one switch loop) or 'unrolled' (every tick, one copy "
             'of the steps per action: a graph that grows with M, the '
             'reference). Same results and features in every one '
             '(docs/pipeline.md).')
    p.Define('loop_budget', periods.DEFAULT_BUDGET,
             "The ops (of the pieces its ticks run) up to which execution "
             "'loop' builds a tick program whole, then folded; past it, one "
             'switch loop. Tuned on a 2-core CPU (benchmarks/trace_cost).')
    p.Define('precision', None,
             "Mixed-precision policy of the cells: 'float32', "
             "'mixed_bfloat16' or 'mixed_float16' (float32 variables, "
             '16-bit math and cell-boundary activations; '
             'gpipe_tf.layers.precision); None: the policy in force where '
             'the layer runs (precision.Policy), float32 by default.')
    p.Define('jit_compile', False,
             'Compile every piece of every cell (its forward, backward, ...) '
             'with XLA (tf.function jit_compile).')
    p.Define('layer_loops', False,
             'Run each cell\'s runs of identical layers (same class and '
             'Params, each taking what the one before returns) as one '
             'loop (layers/shared_run.py): the step\'s graph holds one copy '
             'of the block, not one per layer, so a deep model builds '
             'faster (128 Transformer blocks, 1F1B K=4 M=8: about 0.7x the '
             'first step), but each step costs more (about 1.2x at width '
             '64): docs/scale.md.')
    p.Define('whole_layer_calls', False,
             'Call each cell\'s layers\' shared traces '
             '(layers/shared_trace.py) whole instead of inlining them into '
             'the step: TensorFlow optimises and places a kind of layer '
             'once per device, not once per call, so a deep model builds '
             'faster (128 Transformer blocks, 1F1B K=4 M=8: 0.63x the first '
             'step), but each call runs as a function of its own, which '
             'small layers and tiny micro-batches pay for (the README\'s '
             'quick start: 1.09-1.16x a step; 2 sequences of 16 tokens: up '
             'to 1.6x): docs/scale.md.')
    p.Define('whole_piece_min_flops', None,
             'Call a piece of a cell (its forward, a backward that '
             'recomputes it, the last stage\'s FB, its inference forward) '
             'whole instead of inlining it into the step where it computes '
             'at least this many FLOPs a call and reads no stashed '
             'activations: TensorFlow optimises and places it once per '
             'device, not once per call site, so a deep model builds '
             'faster (128 Transformer blocks, 1F1B K=4 M=8: 0.76-0.96x the '
             'first step at 50_000_000, cell_program.WHOLE_PIECE_MIN_FLOPS, '
             'where a call costs a step a few percent); but an op failing '
             'inside such a piece may come back as a CancelledError, its own '
             'error only in TensorFlow\'s log. 0: every such piece; None '
             '(default): none (docs/scale.md).')
    p.Define('num_virtual_stages', 1,
             'V: cells per device (interleaved schedules); the layers are cut '
             "into K x V cells, cell s on device s % K. schedule='auto' "
             'chooses V itself (1 or 2) and ignores this.')
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
    if p.precision is not None:
      precision.ComputeDtype(p.precision)  # Raises PolicyError.
    if p.execution not in EXECUTIONS:
      raise ValueError(f"PipeliningLayer '{self.path}': unknown execution "
                       f'{p.execution!r}; use one of {EXECUTIONS}.')
    if not isinstance(p.num_virtual_stages, int) or p.num_virtual_stages < 1:
      raise ValueError(f"PipeliningLayer '{self.path}': num_virtual_stages "
                       f'must be an int >= 1, got {p.num_virtual_stages}.')
    if p.whole_piece_min_flops is not None and (
        isinstance(p.whole_piece_min_flops, bool) or
        not isinstance(p.whole_piece_min_flops, int) or
        p.whole_piece_min_flops < 0):
      raise ValueError(
          f"PipeliningLayer '{self.path}': whole_piece_min_flops must be an "
          f'int >= 0 or None, got {p.whole_piece_min_flops!r}.')
    skips = skips_lib.Check(p.layers)
    all_devices = list(p.devices) if p.devices else (
        devices_lib.DefaultDevices())
    self._choice = None  # schedule='auto': the layout.Choice.
    if p.schedule == 'auto':
      self._choice = self._Auto(len(all_devices))
      self._balance = list(self._choice.balance)
      self._schedule = self._choice.schedule
    else:
      self._balance = self._Balance(len(all_devices))
      self._schedule = self._MakeSchedule(
          len(self._balance) // p.num_virtual_stages)
    num_devices = self._schedule.num_devices
    self._kept = self._KeptForwards(self._schedule)
    self._devices = [all_devices[k] for k in range(num_devices)]
    per_layer = [self._devices[self._schedule.DeviceOf(s)]
                 for s, n in enumerate(self._balance) for _ in range(n)]
    self.CreateChildren('layers', p.layers, devices=per_layer)
    self._cells = []
    start = 0
    crossing = skips_lib.Crossing(skips, self._balance)
    for s, n in enumerate(self._balance):
      self._cells.append(cell_lib.Cell(
          s, self.layers[start:start + n],
          self._devices[self._schedule.DeviceOf(s)],
          skip_in=[name for name, _, dst in crossing if dst == s],
          skip_out=[name for name, src, _ in crossing if src == s]))
      start += n

  def _MakeSchedule(self, num_devices: int) -> schedule_lib.Schedule:
    """The schedule: a registered name, a CSV file, or a Schedule object."""
    p = self.p
    sched = p.schedule
    if isinstance(sched, str) and sched.endswith('.csv'):
      sched = schedule_lib.Load(sched)
    if isinstance(sched, schedule_lib.Schedule):
      sched.Validate()
      if (sched.num_devices, sched.num_stages, sched.num_micro_batches) != (
          num_devices, len(self._balance), p.num_micro_batches):
        raise schedule_lib.ScheduleError(
            f"PipeliningLayer '{self.path}': the schedule has "
            f'{sched.num_devices} devices, {sched.num_stages} stages and '
            f'{sched.num_micro_batches} micro-batches; the layer has '
            f'{num_devices} devices, {len(self._balance)} cells and '
            f'num_micro_batches={p.num_micro_batches}: make them agree.')
      return sched
    return _Registered(p.schedule, num_devices, p.num_micro_batches,
                       p.num_virtual_stages)

  def _Auto(self, num_devices: int):
    """schedule='auto': the balance and schedule auto_schedule picks."""
    p = self.p
    if p.balance is not None:
      raise partition.PartitionError(
          f"PipeliningLayer '{self.path}': schedule='auto' chooses the "
          'balance; drop balance, or name a schedule.')
    partition.CheckDevices(p.num_partitions, num_devices)
    return self.AutoChoice(p, self.path)

  @staticmethod
  def AutoChoice(params, path: str = ''):
    """What schedule='auto' picks for these Params, building no pipeline.

    The schedule.layout.Choice (balance, V, schedule, predicted step and
    per-device peaks, budget) that a PipeliningLayer of ``params`` with
    schedule='auto' runs: the same costs (``cost``), sizes
    (``auto_activations``: 'traced' builds and traces a copy of each
    distinct layer) and ``memory_budget`` (None: 1F1B's modelled peak). A tool that predicts or
    tables such a layer reads it here instead of re-deriving it. Logs the
    choice (auto_schedule.Choose), as the layer does; ``path`` names the
    layer in that line.

    Raises:
      cost.CostEstimateError: the costs cannot be estimated.
      schedule.MemoryBudgetError: nothing fits the budget.
    """
    p = params
    shapes = _InputShapes(p) or cost_lib.InferInputShapes(p.layers)
    if p.profile_batch_size is None and not any(
        len(s) and s[0] is not None for s in shapes):
      logging.warning(
          "PipeliningLayer '%s' schedule='auto': no batch size known, so the "
          'memory model counts micro-batches of %d examples; set the batch '
          'dimension of input_shapes to the mini-batch size N (or '
          'profile_batch_size to N / num_micro_batches) for the sizes the '
          'step holds.', path or p.name, cost_lib.DEFAULT_PROFILE_BATCH_SIZE)
    value_bytes = 2 if p.precision in ('mixed_bfloat16', 'mixed_float16') else 4
    layers = auto_schedule.LayerCosts(
        p.layers, p.cost, shapes, p.profile_batch_size, p.num_micro_batches,
        value_bytes, p.auto_activations,
        p.precision or precision.CurrentPolicy())
    return auto_schedule.Choose(layers, p.num_partitions, p.num_micro_batches,
                                p.remat, p.memory_budget, path or p.name)

  def _Balance(self, num_devices: int) -> list[int]:
    """Layers per cell: K x V cells (V = num_virtual_stages)."""
    p = self.p
    v = p.num_virtual_stages
    num_layers = len(p.layers)
    if p.balance is not None:
      balance = partition.ValidateBalance(list(p.balance), num_layers,
                                          num_devices * v)
      if len(balance) % v or p.num_partitions not in (1, len(balance) // v):
        raise partition.PartitionError(
            f'balance {list(p.balance)} has {len(balance)} cells but '
            f'num_partitions={p.num_partitions} x num_virtual_stages={v} '
            f'needs {p.num_partitions * v}; make them agree.')
      return balance
    partition.CheckDevices(p.num_partitions, num_devices)
    num_cells = p.num_partitions * v
    if num_layers < num_cells:
      # Let the partitioner raise its named error saying what would fit.
      return partition.PartitionBalanced([1.0] * num_layers, num_cells)
    if num_cells == 1:
      return [num_layers]
    costs = cost_lib.LayerCosts(p.layers, p.cost, _InputShapes(p),
                                p.profile_batch_size, p.num_micro_batches)
    return partition.PartitionBalanced(costs, num_cells,
                                       self._RecomputeWeights())

  def _RecomputeWeights(self) -> list[float] | None:
    """Per-cell work factors (partition.RecomputeWeights) when remat
    recomputes some cells' forwards more often than others', e.g. under 1F1B
    with remat 'always' the last cell recomputes nothing (each backward
    directly follows its forward), so it can take more layers. Only
    registered schedules are weighed; a schedule given as a file or object is
    balanced on the layer costs alone.
    """
    p = self.p
    if not isinstance(p.schedule, str) or p.schedule.endswith('.csv'):
      return None
    sched = _Registered(p.schedule, p.num_partitions, p.num_micro_batches,
                        p.num_virtual_stages)
    kept = self._KeptForwards(sched)
    if kept is None:
      return None
    m = p.num_micro_batches
    return partition.RecomputeWeights(
        [sum((s, i) not in kept for i in range(m)) / m
         for s in range(sched.num_stages)])

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

  @property
  def schedule_choice(self):
    """With schedule='auto', the schedule.layout.Choice made (predicted step,
    peaks, the layouts considered); else None."""
    return self._choice

  @property
  def cells(self) -> list[cell_lib.Cell]:
    """The K x V cells (stages), in order."""
    return list(self._cells)

  @property
  def needs_loss_inside(self) -> bool:
    """True when training must use ComputeLossAndGradients (not FProp + tape):
    the schedule runs a backward before the last forward."""
    return not self._schedule.IsFillDrain()

  def _KeptForwards(self, sched: schedule_lib.Schedule
                    ) -> frozenset[tuple[int, int]] | None:
    """The (stage, micro-batch) pairs ``remat`` does not recompute
    (memory.KeptForwards, the policy the memory model reads); None: all."""
    if self.p.remat == 'never':
      return None
    return memory.KeptForwards(sched, self.p.remat)

  def _Keep(self, s: int, m: int) -> bool:
    """True when F(s, m) keeps its activations for its backward (False: it
    keeps only its input, and the backward recomputes them)."""
    return self._kept is None or (s, m) in self._kept

  def FProp(self, *inputs, training=False, trace=None):
    """Runs the pipeline; returns the last cell's outputs, merged.

    In training a GradientTape around it yields the pipelined gradients; only
    fill-drain schedules ('gpipe') train this way (others raise
    engine.ScheduleNeedsLossError: use ComputeLossAndGradients).

    Args:
      *inputs: the first layer's inputs (any nests of tensors).
      training: training mode.
      trace: an optional trace.ScheduleTrace recording each action.
    """
    with precision.Policy(self.p.precision), self._Loops():
      return engine.RunPipeline(self._ReplicaCells(), self._schedule,
                                self._Keep, inputs, training, trace,
                                self.p.execution, self.p.jit_compile,
                                self.p.loop_budget)

  def ComputeLossAndGradients(self, inputs, labels, loss_fn: loss_lib.LossFn,
                              variables=None, trace=None, loss_scale=None):
    """Trains one step with the loss inside the pipeline; any schedule.

    The loss of micro-batch m is computed on the last cell's device right after
    its forward, and its backward starts when the schedule says, so 1F1B,
    interleaved and zero-bubble schedules run as well as GPipe.

    Args:
      inputs: the first layer's input (a tensor or a tuple of them).
      labels: any nest of tensors with the same batch dimension, split into
        micro-batches like the inputs.
      loss_fn: (outputs, labels) of one micro-batch -> loss.LossTerms
        (per-example losses, weights, per-example metrics).
      variables: the variables to differentiate; default
        ``self.trainable_variables``.
      trace: an optional trace.ScheduleTrace recording each action.
      loss_scale: an optional float32 scalar the loss is multiplied by
        before it is differentiated (float16 training: the gradients come
        back scaled, the loss and metrics do not).

    Returns:
      (loss, metrics, grads): the mini-batch's weighted mean loss, its metrics
      (weighted means, 'loss' included) and one gradient per variable, equal to
      those of the same loss computed on the whole mini-batch.

    Raises:
      loss.LossNotSplittableError: loss_fn does not return per-example terms.
    """
    if variables is None:
      variables = self.trainable_variables
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    with precision.Policy(self.p.precision), self._Loops():
      return engine.RunLossAndGradients(
          self._ReplicaCells(), self._schedule, self._Keep, inputs, labels,
          loss_fn, list(variables), trace, self.p.execution,
          self.p.jit_compile, loss_scale, self.p.loop_budget)

  @contextlib.contextmanager
  def _Loops(self) -> Any:
    """Where the cells' runs of identical layers are loops (layer_loops),
    where their layers' calls are kept whole (whole_layer_calls) and which
    pieces are called whole (whole_piece_min_flops)."""
    with (shared_run.LoopsInCells() if self.p.layer_loops else
          contextlib.nullcontext()), (
              shared_trace.WholeInCells() if self.p.whole_layer_calls else
              contextlib.nullcontext()), cell_program.WholePieces(
                  self.p.whole_piece_min_flops):
      yield

  def _ReplicaCells(self) -> list[cell_lib.Cell]:
    """The cells, placed on this replica's devices when data-parallel."""
    if self.p.devices:  # Replica 0's, unless a cluster layout says more.
      replica_devices = distribute.ClusterReplicaDevices(self._devices)
    else:
      replica_devices = distribute.ReplicaDevices(len(self._devices))
    if replica_devices is None:
      return self._cells
    return [c.OnDevice(replica_devices[self._schedule.DeviceOf(c.index)])
            for c in self._cells]

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
      return len(params.balance) // max(1, int(params.num_virtual_stages))
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
    shapes = input_shapes or _InputShapes(p) or cost_lib.InferInputShapes(
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
