"""Builds the benchmark's training and inference steps and times them, interleaved round by round.

The entry point (tools/benchmark/main.py) owns the flags and the tables; this
module turns a ModelSpec and a list of configurations into result rows:

  * a configuration is a dict with the keys ``pipeline`` (False: a plain
    SequentialLayer), ``num_partitions`` (K), ``num_micro_batches`` (M),
    ``remat``, ``mode`` ('train' or 'inference'), ``num_replicas`` (R),
    ``schedule`` and ``num_virtual_stages`` (V; gpipe_tf.pipeline.schedule;
    schedule ``AUTO``: PipeliningLayer's schedule='auto', which picks the
    balance, V and schedule within 1F1B's modelled peak; RowLayout says what
    it picked)
    and ``loss_inside``: how a pipelined training step gets its gradients,
    True through ``PipeliningLayer.ComputeLossAndGradients`` with a
    per-example loss (needed by every schedule but 'gpipe'), False through
    ``FProp`` and a GradientTape (fill-drain only);
  * R > 1 trains R replicas of the K-cell pipeline data-parallel over R*K
    devices (gpipe_tf.runtime.distribute.MakeStrategy): each replica pipelines its
    N/R share of the global batch over its own K devices, the gradients are
    averaged across replicas and ONE update is applied per step::

        replica 0: cells on devices 0 .. K-1      examples 0 .. N/R-1
        replica 1: cells on devices K .. 2K-1     examples N/R .. 2N/R-1
        ...        -> mean of the R gradients -> one SGD update

  * ``single_core`` marks the single-core baseline (a SequentialLayer timed
    in its own one-thread process, tools/benchmark/baseline.py);
  * a row is the configuration plus ``examples_per_sec`` (global examples
    over the median step time), ``peak_memory_bytes``,
    ``model_peak_bytes`` (ModelPlan over the sizes the traced step's
    stages hold, gpipe_tf/pipeline/introspect.py: the memory model's figure to
    compare with the measured peak; None where it has none),
    ``device_model_peak_bytes`` (each device's own modelled peak, the same
    sizes) and ``plan_peak_bytes`` (the same model over tools.plan's
    estimated sizes).

Logical CPU devices must exist before this module runs any op
(gpipe_tf.runtime.devices.SplitCpu). It does NOT define flags or print tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import sys
import time
from typing import Any, Callable, ContextManager, Sequence

import tensorflow as tf

from gpipe_tf.runtime import devices as devices_lib
from gpipe_tf.runtime import distribute
from gpipe_tf import layers
from gpipe_tf import pipeline as pipeline_lib
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import precision
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule as schedule_lib

__all__ = ['AUTO', 'AccumulationConfigs', 'Build', 'Config', 'Label',
           'LayersOf', 'LossInside', 'MakeStep', 'Measure', 'Merge',
           'ModelPeakBytes', 'ModelPlan', 'ModelSpec', 'PipelineConfigs',
           'ReplicaConfigs', 'RowLayout', 'Rows', 'ScheduleLabel',
           'StepAndModel', 'StageBalance', 'StageInputs', 'TimeRound',
           'TimedRows']


AUTO = 'auto'  # PipeliningLayer's schedule='auto'.


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The model every configuration trains, its global batch and SGD step."""

  block: str = 'fc'  # 'fc' or 'transformer': kind of the identical blocks.
  num_blocks: int = 32  # L.
  dim: int = 256  # Model width.
  seq_len: int = 32  # Transformer sequence length.
  batch_size: int = 2048  # Global mini-batch N (sequences for transformer).
  learning_rate: float = 1e-4  # Of the one SGD update per step.


def Config(pipeline: bool, num_partitions: int = 1, num_micro_batches: int = 1,
           remat: str = 'none', mode: str = 'train',
           num_replicas: int = 1, single_core: bool = False,
           schedule: str = 'gpipe', num_virtual_stages: int = 1,
           loss_inside: bool = False, dtype: str = 'float32',
           jit_compile: bool = False, execution: str = 'loop') -> dict:
  """One configuration of the grid (see the module docstring for the keys;
  ``dtype`` is a precision policy, layers/precision.py)."""
  return dict(pipeline=pipeline, num_partitions=num_partitions,
              num_micro_batches=num_micro_batches, remat=remat, mode=mode,
              num_replicas=num_replicas, single_core=single_core,
              schedule=schedule, num_virtual_stages=num_virtual_stages,
              loss_inside=loss_inside, dtype=dtype, jit_compile=jit_compile,
              execution=execution)


def LossInside(schedules: Sequence[str]) -> bool:
  """Whether pipelined training rows take the loss-inside path.

  Always when any schedule but 'gpipe' is timed, so that every pipelined row
  (gpipe's too) runs the same kind of step and the rows compare like with like.
  """
  return any(name != 'gpipe' for name in schedules)


def AccumulationConfigs(micro_batches: Sequence[int],
                        dtypes: Sequence[str] = ('float32',)) -> list[dict]:
  """A SequentialLayer running M micro-batches in turn (gradient
  accumulation) for every M > 1: what a pipeline's devices together should
  not do much more work than (tables.AccumulationTable)."""
  return [Config(False, num_micro_batches=m, dtype=dtype)
          for m in micro_batches if m > 1 for dtype in dtypes]


def PipelineConfigs(partitions: Sequence[int], micro_batches: Sequence[int],
                    remats: Sequence[str], inference: bool,
                    schedules: Sequence[str] = ('gpipe',),
                    virtual_stages: int = 2,
                    dtypes: Sequence[str] = ('float32',),
                    jit_compile: Sequence[bool] = (False,),
                    executions: Sequence[str] = ('loop',)) -> list[dict]:
  """The schedule x K x M x remat (x dtype x XLA x execution) grid of one
  replica, after SequentialLayer (once per dtype).

  'interleaved_1f1b' rows have ``virtual_stages`` cells per device (V; V = 1
  would be '1f1b'), every other schedule one. With ``inference``,
  forward-only rows (remat 'never', schedule 'gpipe') for every K and M.

  Raises:
    ValueError: a schedule that is not registered.
  """
  known = schedule_lib.Names() + [AUTO]
  unknown = [name for name in schedules if name not in known]
  if unknown:
    raise ValueError(f"Unknown schedule(s) {', '.join(unknown)}; use names "
                     f"from {', '.join(known)}.")
  inside = LossInside(schedules)
  configs = [Config(False, dtype=dtype) for dtype in dtypes]
  configs += [Config(True, k, m, remat, schedule=name,
                     num_virtual_stages=_VirtualStages(name, virtual_stages),
                     loss_inside=inside, dtype=dtype, jit_compile=jit,
                     execution=execution)
              for name in schedules for k in partitions
              for m in micro_batches for remat in remats
              for dtype in dtypes for jit in jit_compile
              for execution in executions]
  if inference:
    configs += [Config(True, k, m, 'never', 'inference') for k in partitions
                for m in micro_batches]
  return configs


def _VirtualStages(schedule: str, virtual_stages: int) -> int:
  if schedule in schedule_lib.V_SHAPED:  # 2 stages a device, always.
    return 2
  return virtual_stages if schedule == 'interleaved_1f1b' else 1


def ReplicaConfigs(num_devices: int, replicas: Sequence[int],
                   micro_batches: Sequence[int], remats: Sequence[str],
                   batch_size: int, loss_inside: bool = False) -> list[dict]:
  """The R x K grid over D devices: for every R in ``replicas``, K = D / R.

  Schedule 'gpipe', through the loss-inside path when ``loss_inside``.

  Raises:
    ValueError: R does not divide D, or does not divide the global batch.
  """
  configs = []
  for r in replicas:
    if r < 1 or num_devices % r:
      raise ValueError(
          f'{r} replicas do not divide {num_devices} devices; use a divisor '
          f'of {num_devices} (or change the number of devices).')
    if batch_size % r:
      raise ValueError(
          f'{r} replicas do not divide the global batch of {batch_size}; use '
          f'a batch size that is a multiple of {r}.')
    configs += [Config(True, num_devices // r, m, remat, 'train', r,
                       loss_inside=loss_inside)
                for m in micro_batches for remat in remats]
  return configs


def Merge(*grids: Sequence[dict]) -> list[dict]:
  """The configurations of all grids in order, each once."""
  merged = []
  for grid in grids:
    merged += [c for c in grid if c not in merged]
  return merged


def Label(cfg: dict, with_schedule: bool = True) -> str:
  """The row's name, e.g. 'K=2 M=4 remat=never 1f1b'.

  The schedule is named unless it is 'gpipe' or ``with_schedule`` is False.
  """
  if not cfg['pipeline']:
    label = 'SequentialLayer' + (', single core' if cfg['single_core'] else '')
    if cfg['num_micro_batches'] > 1:
      label += f", M={cfg['num_micro_batches']} in turn"
  else:
    label = (f"K={cfg['num_partitions']} M={cfg['num_micro_batches']} "
             f"remat={cfg['remat']}")
    if with_schedule and cfg['schedule'] != 'gpipe':
      label += f" {ScheduleLabel(cfg)}"
  if cfg['num_replicas'] > 1:
    label = f"R={cfg['num_replicas']} " + label
  for key, default in (('dtype', 'float32'), ('execution', 'loop')):
    if cfg.get(key, default) != default:
      label += f' {cfg[key]}'
  if cfg.get('jit_compile'):
    label += ' XLA'
  return label + (' (inference)' if cfg['mode'] == 'inference' else '')


def ScheduleLabel(cfg: dict) -> str:
  """The row's schedule, with its V when V > 1: e.g. 'interleaved_1f1b V=2'."""
  v = cfg['num_virtual_stages']
  return cfg['schedule'] + (f' V={v}' if v > 1 else '')


def Measure(spec: ModelSpec, configs: Sequence[dict], num_devices: int,
            rounds: int, steps_per_round: int,
            log: Callable[[str], None] | None = None,
            also_time: Sequence[Callable[[], None]] = ()) -> list[dict]:
  """Builds every configuration's step, then times them round by round, on
  the first ``num_devices`` (D) default devices: TimedRows's rows.

  Args:
    spec: the model and global batch.
    configs: configurations (Config dicts).
    num_devices: D, the logical devices replicas and cells are placed on.
    rounds, steps_per_round, log, also_time: as TimedRows.

  Returns:
    One row per configuration, in order: the configuration plus
    ``examples_per_sec`` and ``peak_memory_bytes`` (Rows).
  """
  rows, _ = TimedRows(spec, configs,
                      devices_lib.DefaultDevices()[:num_devices], rounds,
                      steps_per_round, log, also_time)
  return rows


def TimedRows(spec: ModelSpec, configs: Sequence[dict],
              all_devices: Sequence[str], rounds: int, steps_per_round: int,
              log: Callable[[str], None] | None = None,
              also_time: Sequence[Callable[[], None]] = (),
              peak: Callable[[Callable[[], tf.Tensor]], Any] | None = None,
              around: Callable[[int], ContextManager] | None = None
              ) -> tuple[list[dict], list]:
  """The measuring loop of both modes (shared CPU and --devices=processes):
  builds every configuration's step (Build), then times them round by
  round.

  ``rounds`` times, every step runs ``steps_per_round`` times in turn; the
  time per step is the median round.

  Args:
    spec: the model and global batch.
    configs: configurations (Config dicts).
    all_devices: the devices replicas and cells are placed on.
    rounds: timed rounds per configuration.
    steps_per_round: steps per timed round.
    log: called with a line after each configuration is built.
    also_time: called first in every round, each to time one round of
      something measured elsewhere (the single-core baseline in its own
      process), so that it sees the same machine as the grid. They keep
      their own results.
    peak: reads a step's peak memory (Build's; default the process's
      allocator); one that gives a list (a value per device) counts its
      sum as the row's ``peak_memory_bytes``.
    around: given a configuration's index, a context manager entered around
      each of its timed rounds (processes mode reads its workers' counters
      there).

  Returns:
    (Rows's rows, each configuration's peak as ``peak`` read it).
  """
  steps, peaks, sizes = Build(spec, configs, all_devices, log,
                              peak or _ProcessPeak)
  times = [[] for _ in configs]
  for _ in range(rounds):
    for time_round in also_time:
      time_round()
    for i, step in enumerate(steps):
      with around(i) if around else contextlib.nullcontext():
        times[i].append(TimeRound(step, steps_per_round))
  totals = [sum(p) if isinstance(p, (list, tuple)) else p for p in peaks]
  return Rows(spec, configs, times, totals, sizes), peaks


def _ProcessPeak(step: Callable[[], tf.Tensor]) -> int:
  """The most the (process-wide) allocator held during one more step
  beyond what it held before it."""
  tf.config.experimental.reset_memory_stats('CPU:0')
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  step().numpy()
  return int(tf.config.experimental.get_memory_info('CPU:0')['peak'] - before)


def Build(spec: ModelSpec, configs: Sequence[dict], all_devices: Sequence[str],
          log: Callable[[str], None] | None = None,
          peak: Callable[[Callable[[], tf.Tensor]], Any] = _ProcessPeak
          ) -> tuple[list[Callable[[], tf.Tensor]], list, list]:
  """Every configuration's step, traced and warmed up, its peak memory, and
  the sizes its stages hold (gpipe_tf.pipeline.introspect.TracedStageBytes: None
  for a row that is not a pipeline, or whose sizes are not known).

  The peak is `peak(step)`'s, read over one more step: by default the most
  the (process-wide) allocator held during it beyond what it held before
  (tools.benchmark.processes reads each worker's).
  """
  from gpipe_tf.pipeline import introspect  # pylint: disable=g-import-not-at-top
  log = log or (lambda line: print(line, file=sys.stderr, flush=True))
  steps, peaks, sizes = [], [], []
  for cfg in configs:
    step, model = StepAndModel(spec, cfg, all_devices)
    step().numpy()  # Trace and warm up.
    peaks.append(peak(step))
    steps.append(step)
    sizes.append(introspect.TracedStageBytes(model.cells)
                 if cfg['pipeline'] else None)
    log(f'built {Label(cfg)}')
  return steps, peaks, sizes


def TimeRound(step: Callable[[], tf.Tensor], steps_per_round: int) -> float:
  """Seconds per step of ``steps_per_round`` steps run back to back."""
  start = time.perf_counter()
  for _ in range(steps_per_round):
    loss = step()
  loss.numpy()
  return (time.perf_counter() - start) / steps_per_round


def Rows(spec: ModelSpec, configs: Sequence[dict],
         times: Sequence[Sequence[float]], peaks: Sequence[int],
         stage_bytes: Sequence[list | None] | None = None) -> list[dict]:
  """The result rows: each configuration with its median throughput, peak,
  the memory model's peaks (ModelPlan; ``model_peak_bytes`` over the
  traced sizes ``stage_bytes`` (Build's) where given, ``plan_peak_bytes``
  over the layers' FPropMeta sizes; ``device_model_peak_bytes``, each
  device's own peak over the same sizes as ``model_peak_bytes``) and the
  seconds per step of every round (in the order they ran)."""
  stage_bytes = stage_bytes or [None] * len(configs)
  rows = []
  for cfg, ts, peak, sizes in zip(configs, times, peaks, stage_bytes):
    estimated = ModelPlan(spec, cfg)
    traced = (estimated if sizes is None or estimated is None else
              ModelPlan(spec, cfg, sizes))
    rows.append(dict(
        cfg, examples_per_sec=spec.batch_size / statistics.median(ts),
        peak_memory_bytes=int(peak),
        model_peak_bytes=_Total(traced),
        device_model_peak_bytes=(None if traced is None else
                                 [int(b) for b in traced.step_bytes]),
        plan_peak_bytes=_Total(estimated),
        seconds_per_step_rounds=[float(t) for t in ts]))
    if cfg['pipeline'] and cfg['schedule'] == AUTO:
      rows[-1]['auto'] = AutoFields(spec, cfg)
  return rows


def AutoFields(spec: ModelSpec, cfg: dict) -> dict:
  """What an 'auto' row's PipeliningLayer chose (RowLayout): the candidate
  it came from, V, the balance, its simulated step in the layer's cost units,
  and per device the budget, the weights and the peak of the library's
  memory model (bytes, weights included; the measured peaks leave the
  weights out, so a device keeps within the budget when its measured peak
  is at most ``budget_step_bytes``, the budget less its weights)."""
  choice = _AutoChoice(spec, cfg['num_partitions'], cfg['num_micro_batches'],
                       cfg['remat'])
  best = choice.synthesized.best
  weights = [sum(b.weights for s, b in enumerate(choice.problem.stage_bytes)
                 if best.schedule.DeviceOf(s) == d)
             for d in range(best.schedule.num_devices)]
  library = choice.synthesized.best_library
  return dict(source=best.source,
              num_virtual_stages=choice.num_virtual_stages,
              balance=list(choice.balance),
              simulated_step=best.makespan,
              best_library=None if library is None else library.source,
              budget_bytes=list(choice.synthesized.budget),
              weight_bytes=weights,
              budget_step_bytes=[b - w for b, w in
                                 zip(choice.synthesized.budget, weights)],
              model_peak_bytes=list(best.peaks))


def ModelPlan(spec: ModelSpec, cfg: dict,
              stage_bytes: Sequence[object] | None = None) -> Any:
  """The memory model of a pipelined training row, to set beside the measured peaks.

  tools.plan.lib.Evaluate's Plan (schedule.memory.Profile over the
  simulated step): its ``total_step_bytes`` are the gradient sums and
  activations all devices hold at the worst moment, as the measured peak
  counts them on one shared allocator; its ``step_bytes`` each device's own
  worst moment, as each worker's allocator holds it (--devices=processes).
  The sizes are ``stage_bytes`` (one schedule.memory.StageBytes per stage:
  gpipe_tf.pipeline.introspect.TracedStageBytes) when given, else those tools.plan
  estimates from the layers' FPropMeta (4 bytes a value). None for rows it
  does not model: not pipelined, inference, R > 1 or a dtype other than
  float32. Runs no TensorFlow op.
  """
  if (not cfg['pipeline'] or cfg['mode'] != 'train' or
      cfg['num_replicas'] > 1 or cfg.get('dtype', 'float32') != 'float32'):
    return None
  from tools.plan import lib as plan_lib  # pylint: disable=g-import-not-at-top
  blocks, shapes = LayersOf(spec)
  model = plan_lib.ModelOf(blocks, shapes, bytes_per_param=4)
  schedule, balance = RowLayout(spec, cfg)
  layout = plan_lib.Layout(cfg['num_partitions'], 1, cfg['num_micro_batches'],
                           cfg['schedule'],
                           schedule.num_stages // schedule.num_devices,
                           cfg['remat'])
  return plan_lib.Evaluate(model, layout, spec.batch_size,
                           stage_bytes=stage_bytes, schedule=schedule,
                           balance=balance)


def ModelPeakBytes(spec: ModelSpec, cfg: dict,
                   stage_bytes: Sequence[object] | None = None) -> int | None:
  """ModelPlan's peak over all devices (its total_step_bytes), or None."""
  return _Total(ModelPlan(spec, cfg, stage_bytes))


def _Total(plan: Any) -> int | None:
  return None if plan is None else int(plan.total_step_bytes)


def MakeStep(spec: ModelSpec, cfg: dict,
             all_devices: Sequence[str]) -> Callable[[], tf.Tensor]:
  """A tf.function running one step of ``cfg``; it returns the global loss
  (StepAndModel's step)."""
  return StepAndModel(spec, cfg, all_devices)[0]


def StepAndModel(spec: ModelSpec, cfg: dict, all_devices: Sequence[str]
                 ) -> tuple[Callable[[], tf.Tensor], object]:
  """(a tf.function running one step of ``cfg``, returning the global loss;
  the model it runs: a PipeliningLayer or a SequentialLayer).

  Training: forward, backward and one SGD update of the mean squared output
  over the global batch (for R > 1: each replica's mean over its share, the
  gradients averaged across replicas, one update of the mirrored weights);
  with ``loss_inside`` the same loss as per-example terms computed inside
  the pipeline (ComputeLossAndGradients). Inference: the forward pass only
  (training=False).
  """
  if cfg['num_replicas'] > 1:
    return _ReplicatedStep(spec, cfg, all_devices)
  # The input sits where cell 0 runs; a SequentialLayer runs there too.
  with tf.device(all_devices[0]):
    inputs = _Inputs(spec)
  with _Unpipelined(cfg, all_devices):
    model = _Build(spec, cfg, all_devices)

  if cfg['mode'] == 'inference':

    @tf.function
    def _Infer():
      with precision.Policy(cfg.get('dtype', 'float32')), _Unpipelined(
          cfg, all_devices):
        return _Loss(model, inputs, training=False)

    return _Infer, model

  @tf.function
  def _Step():
    variables = model.trainable_variables
    with precision.Policy(cfg.get('dtype', 'float32')), _Unpipelined(
        cfg, all_devices):
      loss, grads = _LossAndGradients(model, cfg, inputs, variables)
    for v, g in zip(variables, grads):
      # Plain SGD beside its variable: with cells on worker processes, an
      # optimizer's ops without a device would run on the chief, and every
      # gradient would cross to it and back.
      with tf.device(v.device):
        v.assign_sub(tf.cast(spec.learning_rate, g.dtype) * g)
    return loss

  return _Step, model


def RowLayout(spec: ModelSpec, cfg: dict
              ) -> tuple[schedule_lib.Schedule, tuple[int, ...]]:
  """(the schedule, blocks per stage) a pipelined row's PipeliningLayer runs:
  the registered schedule on StageBalance's cut, or for AUTO what
  PipeliningLayer.AutoChoice picks. Runs no TensorFlow op."""
  if cfg['schedule'] == AUTO:
    choice = _AutoChoice(spec, cfg['num_partitions'],
                         cfg['num_micro_batches'], cfg['remat'])
    return choice.schedule, tuple(choice.balance)
  return (schedule_lib.Make(cfg['schedule'], cfg['num_partitions'],
                            cfg['num_micro_batches'],
                            cfg['num_virtual_stages']),
          StageBalance(spec, cfg))


@functools.lru_cache(maxsize=16)
def _AutoChoice(spec, num_partitions, num_micro_batches, remat):
  return pipeline_lib.PipeliningLayer.AutoChoice(_PipelineParams(
      spec, Config(True, num_partitions, num_micro_batches, remat,
                   schedule=AUTO)))


def StageBalance(spec: ModelSpec, cfg: dict) -> tuple[int, ...]:
  """Blocks per stage of a pipelined row, as its PipeliningLayer cuts them
  (FLOPs weighted by each stage's recompute share: tools.plan.lib.Evaluate;
  for AUTO, RowLayout's). Runs no TensorFlow op."""
  if cfg['schedule'] == AUTO:
    return RowLayout(spec, cfg)[1]
  from tools.plan import lib as plan_lib  # pylint: disable=g-import-not-at-top
  blocks, shapes = LayersOf(spec)
  layout = plan_lib.Layout(cfg['num_partitions'], 1, cfg['num_micro_batches'],
                           cfg['schedule'], cfg['num_virtual_stages'],
                           cfg['remat'])
  return plan_lib.Evaluate(plan_lib.ModelOf(blocks, shapes, bytes_per_param=4),
                           layout, spec.batch_size).balance


def StageInputs(spec: ModelSpec, num_blocks: int, num_examples: int,
                device: str) -> tuple[object, tuple]:
  """A SequentialLayer of ``num_blocks`` of the model's blocks and an input
  of ``num_examples`` examples, both on ``device``: one stage's work on one
  micro-batch, to time its pieces alone."""
  with tf.device(device):
    layer = layers.SequentialLayer.Params().Set(
        name='stage', layers=[_BlockParams(spec, i)
                              for i in range(num_blocks)]).Instantiate()
    inputs = tuple(tf.identity(x[:num_examples]) for x in _Inputs(spec))
    with aux_losses.Collect():  # Creates the variables; timed, not trained.
      layer.FProp(*inputs, training=True)
  return layer, inputs


def _Unpipelined(cfg, all_devices):
  """A SequentialLayer's placement (the first device); none for a pipeline."""
  if cfg['pipeline']:
    return contextlib.nullcontext()
  return tf.device(all_devices[0])


def _ReplicatedStep(spec, cfg, all_devices):
  if cfg['mode'] != 'train':
    raise ValueError('Only training steps are replicated; use R=1 for '
                     'inference.')
  r, k = cfg['num_replicas'], cfg['num_partitions']
  strategy = distribute.MakeStrategy(r, k, all_devices)
  with strategy.scope():
    model = _Build(spec, cfg)
    opt = tf.keras.optimizers.SGD(spec.learning_rate)
  inputs = _Inputs(spec)
  share = spec.batch_size // r
  replica_devices = strategy.extended.worker_devices

  def _Share(ctx):
    i = ctx.replica_id_in_sync_group
    with tf.device(replica_devices[i]):
      return tuple(tf.identity(x[i * share:(i + 1) * share]) for x in inputs)

  shares = strategy.experimental_distribute_values_from_function(_Share)
  variables = model.trainable_variables

  def _LossAndGrads(*replica_inputs):
    return _LossAndGradients(model, cfg, replica_inputs, variables)

  @tf.function
  def _Step():
    per_replica = strategy.run(_LossAndGrads, args=shares)
    loss, grads = tf.nest.map_structure(
        lambda x: strategy.reduce(tf.distribute.ReduceOp.MEAN, x, axis=None),
        per_replica)
    opt.apply_gradients(zip(grads, variables))
    return loss

  return _Step, model


def _LossAndGradients(model, cfg, inputs, variables):
  """The training loss and its gradients, by the row's path. A
  SequentialLayer with M > 1 runs the M micro-batches in turn and sums their
  gradients (gradient accumulation): the work a pipeline of M micro-batches
  does, on one device."""
  if not cfg['pipeline'] and cfg['num_micro_batches'] > 1:
    return _Accumulated(model, cfg['num_micro_batches'], inputs, variables)
  if cfg['loss_inside']:
    labels = tf.zeros(tf.shape(inputs[0])[:1])  # Unused; split like inputs.
    loss, _, grads = model.ComputeLossAndGradients(
        tuple(inputs), labels, _PerExampleLoss, variables)
    return loss, grads
  with tf.GradientTape() as tape:
    loss = _Loss(model, inputs, training=True)
  return loss, tape.gradient(loss, variables)


def _Accumulated(model, num_micro_batches, inputs, variables):
  """_Loss and its gradients over M equal micro-batches run one after
  another: each micro-batch's mean weighs 1/M, applied once to the sums. A
  variable no micro-batch's loss reads has the gradient None, as a tape's."""
  parts = [tf.split(x, num_micro_batches) for x in inputs]
  loss, grads = 0.0, [None] * len(variables)
  for m in range(num_micro_batches):
    with tf.GradientTape() as tape:
      part = _Loss(model, [p[m] for p in parts], training=True)
    loss += part
    for i, g in enumerate(tape.gradient(part, variables)):
      if g is not None:
        grads[i] = g if grads[i] is None else grads[i] + g
  return (loss / num_micro_batches,
          [None if g is None else g / num_micro_batches for g in grads])


def _PerExampleLoss(outputs, labels):
  """_Loss as per-example (per-token) terms: their mean is _Loss."""
  del labels
  y = outputs[0] if isinstance(outputs, tuple) else outputs
  return loss_lib.LossTerms(tf.reduce_mean(tf.square(y), axis=-1))


def _Loss(model, inputs, training):
  """The mean squared output, plus in training the auxiliary losses the
  layers add (aux_losses: a pipeline's FProp gives its batch's, weighed by
  micro-batch size, as ComputeLossAndGradients weighs them here)."""
  with aux_losses.Collect() as aux:
    out = precision.ToFloat32(model.FProp(*inputs, training=training))
  y = out[0] if isinstance(out, tuple) else out
  return tf.reduce_mean(tf.square(y)) + aux.Total()


def _BlockParams(spec, i):
  d = spec.dim
  if spec.block == 'fc':
    return layers.FCLayer.Params().Set(name=f'block{i}', input_dim=d,
                                       output_dim=d, activation='RELU')
  return layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=d, hidden_dim=4 * d, num_heads=4)


def _Inputs(spec):
  n, d = spec.batch_size, spec.dim
  if spec.block == 'fc':
    return (tf.random.stateless_normal([n, d], [1, 2]),)
  t = spec.seq_len
  return tf.random.stateless_normal([n, t, d], [1, 2]), tf.zeros([n, t])


def _InputShapes(spec):
  if spec.block == 'fc':
    return [(None, spec.dim)]
  return [(None, spec.seq_len, spec.dim), (None, spec.seq_len)]


def LayersOf(spec: ModelSpec) -> tuple[list, list]:
  """The model's block Params and the input shapes of the first (batch None)."""
  return ([_BlockParams(spec, i) for i in range(spec.num_blocks)],
          _InputShapes(spec))


def _Build(spec, cfg, all_devices=None):
  """The model of ``cfg``; a pipeline's cells on the first K of
  ``all_devices`` (default: the default devices)."""
  if not cfg['pipeline']:
    blocks, _ = LayersOf(spec)
    return layers.SequentialLayer.Params().Set(name='net',
                                               layers=blocks).Instantiate()
  return _PipelineParams(spec, cfg, all_devices).Instantiate()


def _PipelineParams(spec, cfg, all_devices=None):
  """The PipeliningLayer Params of a pipelined row. AUTO's input shapes
  carry the batch N: its memory model counts micro-batches of N / M
  examples (without it, PipeliningLayer.AutoChoice's default)."""
  blocks, shapes = LayersOf(spec)
  if cfg['schedule'] == AUTO:
    shapes = [(spec.batch_size,) + tuple(s[1:]) for s in shapes]
  return pipeline_lib.PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=cfg['num_partitions'],
      num_micro_batches=cfg['num_micro_batches'], remat=cfg['remat'],
      schedule=cfg['schedule'],
      num_virtual_stages=cfg['num_virtual_stages'],
      execution=cfg.get('execution', 'loop'),
      jit_compile=cfg.get('jit_compile', False),
      input_shapes=shapes,
      devices=list(all_devices) if all_devices else None)
