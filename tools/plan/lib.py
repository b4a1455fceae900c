"""Estimates the throughput and per-device memory of pipeline layouts (K, R, M, schedule, V, remat) and ranks them.

tools/plan/main.py is the entry point; this module is the planning, pure Python
over numbers (FLOPs, parameters and output sizes per layer, from FPropMeta by
``ModelOf``), tested without devices. For D devices and a global batch N:

  * every K dividing D gives R = D / K replicas of a K-device pipeline, each
    with n = N / R examples cut into M micro-batches of b = ceil(n / M);
  * the layers are cut into S = K x V stages by partition.PartitionBalanced
    (weighted by each stage's recompute share, as PipeliningLayer does)
    on forward FLOPs (what PipeliningLayer's cost='flops' does);
  * stage s takes F_s = flops_s x b / flops_per_second per forward,
    B_s = F_s (+ r_s x F_s with remat 'always') for the input gradient and
    W_s = F_s for the weight gradients (BW = B + W, ~2 F), F and B each
    plus ``layer_pass_seconds`` per layer of the stage (a fixed cost per
    pass, measured by plan_check.Calibrate; 0 by default). r_s is the share
    of stage s's micro-batches whose forward is recomputed: all but those
    whose backward directly follows their forward on the device
    (Schedule.ForwardsFollowedByBackward; PipeliningLayer keeps them), so
    r_s = 0 on 1F1B's last stage and (M - 1) / M on every GPipe stage
    (V = 1); the saving is spread evenly over the stage's backwards;
  * schedule.Simulate(schedule.Make(name, K, M, V), F, B, W) gives the
    makespan, the bubble and peak_in_flight, the most (stage, micro-batch)
    pairs whose activations each device holds;
  * memory of a device = the weight + optimizer slots bytes of its stages'
    parameters + the most step bytes it holds at once in the simulated step:
    gradient sums and activations, as schedule.memory.Profile models them
    (a kept forward holds its stage's input and every layer's output until
    its backward, a recomputed one only its input, rebuilt while its
    backward runs; a split backward's B stashes what its deferred W reads);
    sizes are FPropMeta's output shapes x 4 bytes;
  * estimated throughput = R x n / makespan examples/sec.

Plans over the memory budget are dropped; the rest are ranked by estimated
throughput, then by fewer micro-batches, then by memory. Deliberately NOT
modelled: transfers between stages and the all-reduce between replicas,
waits between actions, kernels that run faster on larger micro-batches,
the backward pass's temporary buffers, the loss, the allocator's
fragmentation. Without the pass cost, more micro-batches and more replicas
always look at least as good here as they are; docs/planning.md compares
the estimates with measured runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

from gpipe_tf import errors
from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory

__all__ = ['Best', 'Candidates', 'Evaluate', 'FormatTable', 'LayerCost',
           'Layout', 'MIB', 'Model', 'ModelOf', 'Plan', 'PlanError', 'REMATS',
           'Rank', 'Reason']

REMATS = ('never', 'always')
MIB = 2**20


class PlanError(errors.Error, ValueError):
  """No layout fits the request; the message says what would."""


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """What one layer costs per example."""
  flops: float  # Forward FLOPs.
  num_params: int
  output_bytes: int  # Bytes of its outputs.
  # Bytes its kept forward stashes for the backward beyond its inputs, and
  # its B for its W (layer_bytes.py); None: estimated from its outputs.
  kept_bytes: int | None = None
  wcut_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Model:
  """The layers' costs and the bytes of a parameter."""
  layers: tuple[LayerCost, ...]
  input_bytes: int  # Bytes per example of the first layer's inputs.
  bytes_per_param: int  # Weight + optimizer slots (tools.plan.model_stats).
  grad_bytes_per_param: int = 4  # The gradient, held during the step.


@dataclasses.dataclass(frozen=True)
class Layout:
  """One candidate: K devices per replica, R replicas, M, schedule, V, remat."""
  num_partitions: int
  num_replicas: int
  num_micro_batches: int
  schedule: str
  num_virtual_stages: int
  remat: str

  def Label(self) -> str:
    v = f' V={self.num_virtual_stages}' if self.num_virtual_stages > 1 else ''
    return (f'K={self.num_partitions} R={self.num_replicas} '
            f'M={self.num_micro_batches} {self.schedule}{v} '
            f'remat={self.remat}')


@dataclasses.dataclass(frozen=True)
class Plan:
  """A layout and its estimates (per-device tuples: one entry per device)."""
  layout: Layout
  balance: tuple[int, ...]  # Layers per stage.
  makespan: float  # Seconds per step at flops_per_second.
  bubble_fraction: float
  examples_per_sec: float
  peak_in_flight: tuple[int, ...]
  static_bytes: tuple[int, ...]  # Weights and optimizer slots.
  step_bytes: tuple[int, ...]  # Gradients and held activations, each's peak.
  # Gradients and activations of all devices at the busiest moment (one
  # allocator for all, as logical devices on a CPU).
  total_step_bytes: float = 0.0
  fits: bool = True

  @property
  def memory_bytes(self) -> int:
    """The fullest device's total."""
    return max(s + t for s, t in zip(self.static_bytes, self.step_bytes))

  def AsDict(self) -> dict[str, Any]:
    """The plan as JSON-able fields, the layout's flattened in."""
    fields = dataclasses.asdict(self)
    return dict(fields.pop('layout'), **fields,
                memory_bytes=self.memory_bytes)


def ModelOf(layer_params: Sequence, input_shapes: Sequence,
            bytes_per_param: int, value_bytes: int = 4,
            activation_bytes: int | None = None) -> Model:
  """The costs of a layer list from its FPropMeta (no variables are built).

  Output bytes count every batched output (rank >= 1) as
  ``activation_bytes`` per element (default ``value_bytes``: 2 under a
  16-bit precision policy), whatever its dtype; a gradient is
  ``value_bytes`` per parameter.
  """
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  act = value_bytes if activation_bytes is None else activation_bytes
  metas = core.MetaOfSequence(list(layer_params), tuple(input_shapes))
  layers = tuple(LayerCost(float(m.flops), int(m.num_params),
                           _BytesPerExample(m.out_shapes, act))
                 for m in metas)
  return Model(layers, _BytesPerExample(input_shapes, act),
               bytes_per_param, value_bytes)


def WithKeptBytes(model: Model, kept: Sequence[tuple[int, int] | None]
                  ) -> Model:
  """`model` with each layer's (kept_bytes, wcut_bytes)
  (layer_bytes.KeptBytes; None leaves a layer's estimates from its
  outputs)."""
  if len(kept) != len(model.layers):
    raise PlanError(f'give one kept size per layer: {len(model.layers)} '
                    f'layers, got {len(kept)}')
  return dataclasses.replace(model, layers=tuple(
      c if k is None else dataclasses.replace(c, kept_bytes=k[0],
                                              wcut_bytes=k[1])
      for c, k in zip(model.layers, kept)))


def _BytesPerExample(shapes: Sequence, value_bytes: int) -> int:
  return sum(value_bytes * math.prod(int(d or 1) for d in s[1:])
             for s in shapes if len(s))


def Candidates(num_devices: int, batch_size: int, num_layers: int,
               schedules: Sequence[str] | None = None,
               remats: Sequence[str] = REMATS,
               virtual_stages: Sequence[int] = (2,),
               max_micro_batches: int = 64) -> list[Layout]:
  """Every layout to consider for D devices and a global batch of N.

  K divides D and N / (D / K) is whole; M is a power of 2 up to the
  per-replica batch and ``max_micro_batches``; 'interleaved_1f1b' takes
  each V in ``virtual_stages`` (its V = 1 is '1f1b'), the V-shaped ones
  ('zbv', 'dualpipe_v') V = 2 where they exist, every other schedule V = 1;
  K x V stages need at least as many layers.

  Raises:
    PlanError: a schedule that is not registered, or D, N or the largest M
      below 1.
  """
  for value, name in ((num_devices, 'devices'), (batch_size, 'batch size'),
                      (max_micro_batches, 'largest M')):
    if value < 1:
      raise PlanError(f'The {name} must be >= 1, got {value}.')
  names = list(schedules or schedule_lib.Names())
  unknown = [n for n in names if n not in schedule_lib.Names()]
  if unknown:
    raise PlanError(f"Unknown schedule(s) {', '.join(unknown)}; use names "
                    f"from {', '.join(schedule_lib.Names())}.")
  layouts = []
  for k in (k for k in range(1, num_devices + 1) if num_devices % k == 0):
    r = num_devices // k
    if batch_size % r:
      continue
    n = batch_size // r
    micro = [2**i for i in range(int(math.log2(min(n, max_micro_batches))) + 1)]
    for name in names:
      vs = (virtual_stages if name == 'interleaved_1f1b' else
            (2,) if name in schedule_lib.V_SHAPED else (1,))
      for v in (v for v in vs if k * v <= num_layers):
        layouts += [Layout(k, r, m, name, v, remat) for m in micro
                    if _Fits(name, k, m, v) for remat in remats]
  return layouts


def _Fits(name: str, k: int, m: int, v: int) -> bool:
  """Whether the schedule exists for K, M and V (DualPipeV needs M >= 2K)."""
  try:
    _Schedule(name, k, m, v)
  except schedule_lib.ScheduleError:
    return False
  return True


def Evaluate(model: Model, layout: Layout, batch_size: int,
             flops_per_second: float = 1e12,
             layer_pass_seconds: float = 0.0,
             stage_bytes: Sequence[memory.StageBytes] | None = None,
             schedule: schedule_lib.Schedule | None = None,
             balance: Sequence[int] | None = None) -> Plan:
  """The estimated step time, bubble and per-device memory of one layout.

  Args:
    model: the layers' costs.
    layout: the candidate.
    batch_size: the global batch N (each replica gets N / R).
    flops_per_second: a device's speed; it scales every time alike.
    layer_pass_seconds: what a device spends per layer each time a
      forward or a backward of a stage passes through it, whatever the
      micro-batch's size (dispatching its ops); F and B of a stage of n
      layers take n times it more (W none: the engine runs it with B
      unless the schedule defers it). 0 leaves it out; plan_check.Calibrate
      measures it.
    stage_bytes: one schedule.memory.StageBytes per stage, in place of the
      ones the layers' output sizes give (memory.StageBytesOf): e.g. the
      sizes a traced step holds (gpipe_tf.pipeline.introspect).
    schedule, balance: a schedule and the layers per stage to run it on
      (e.g. PipeliningLayer.AutoChoice's), in place of layout.schedule's
      registered one and the FLOPs balance; layout.schedule then only
      labels the plan.

  Raises:
    PlanError: stage_bytes given, but not one per stage.
  """
  k, v = layout.num_partitions, layout.num_virtual_stages
  n = batch_size // layout.num_replicas
  b = -(-n // layout.num_micro_batches)  # The largest micro-batch.
  layers = model.layers
  sched = schedule or _Schedule(layout.schedule, k, layout.num_micro_batches,
                                v)
  kept = memory.KeptForwards(sched, layout.remat)
  recomputed = {(s, m) for s in range(sched.num_stages)
                for m in range(sched.num_micro_batches)} - kept
  shares = [sum((s, m) in recomputed for m in range(sched.num_micro_batches))
            / sched.num_micro_batches for s in range(sched.num_stages)]
  # As PipeliningLayer does: a stage that recomputes more takes fewer layers.
  weights = partition.RecomputeWeights(shares)
  if balance is None:
    balance = _Balance(tuple(c.flops for c in layers), sched.num_stages,
                       None if weights is None else tuple(weights))
  stages = partition.SplitByBalance(list(layers), balance)
  # Simulate needs positive times: a stage without FLOPs takes a tiny one.
  fwd = [max(sum(c.flops for c in st) * b / flops_per_second, 1e-12)
         for st in stages]
  passes = [len(st) * layer_pass_seconds for st in stages]
  sim = schedule_lib.Simulate(
      sched, [f + o for f, o in zip(fwd, passes)],
      [f * (1 + r) + o for f, r, o in zip(fwd, shares, passes)], fwd)
  if stage_bytes is None:
    inputs = [model.input_bytes] + [st[-1].output_bytes
                                    for st in stages[:-1]]
    stage_bytes = [
        memory.StageBytesOf(i, [c.output_bytes for c in st],
                            sum(c.num_params for c in st), b,
                            model.bytes_per_param, model.grad_bytes_per_param,
                            [c.kept_bytes for c in st],
                            [c.wcut_bytes for c in st])
        for i, st in zip(inputs, stages)]
  elif len(stage_bytes) != sched.num_stages:
    raise PlanError(f'give one StageBytes per stage: {layout.Label()} has '
                    f'{sched.num_stages} stages, got {len(stage_bytes)}')
  held = memory.Profile(sched, stage_bytes, kept, sim)
  return Plan(layout, tuple(balance), sim.makespan, sim.bubble_fraction,
              layout.num_replicas * n / sim.makespan,
              tuple(sim.peak_in_flight), held.weights, held.step_peak,
              held.total_step_peak)


# Both are the same for every M / remat / schedule (resp. remat) of a Rank
# and take seconds for a thousand layers or K x M in the thousands.
@functools.lru_cache(maxsize=32)
def _Balance(flops: tuple[float, ...], num_stages: int,
             weights: tuple[float, ...] | None) -> tuple[int, ...]:
  return tuple(partition.PartitionBalanced(flops, num_stages, weights))


@functools.lru_cache(maxsize=256)
def _Schedule(name: str, k: int, m: int, v: int) -> schedule_lib.Schedule:
  return schedule_lib.Make(name, k, m, v)


def Rank(model: Model, num_devices: int, batch_size: int,
         memory_budget_bytes: float | None = None,
         flops_per_second: float = 1e12, **candidate_args) -> list[Plan]:
  """Every candidate's Plan: those that fit first, each group fastest first.

  ``candidate_args`` go to Candidates (schedules, remats, virtual_stages,
  max_micro_batches). Ties in throughput go to fewer passes per stage (M x
  V: the model leaves out per-pass overheads), then to the smaller memory,
  then to fewer devices per replica, by schedule name, and to remat 'never'
  (an 'always' that recomputes nothing, as at M = 1, ties with it).
  """
  plans = []
  for layout in Candidates(num_devices, batch_size, len(model.layers),
                           **candidate_args):
    plan = Evaluate(model, layout, batch_size, flops_per_second)
    fits = memory_budget_bytes is None or (plan.memory_bytes <=
                                           memory_budget_bytes)
    plans.append(dataclasses.replace(plan, fits=fits))
  return sorted(plans, key=_Order)


def _Order(plan: Plan) -> tuple:
  # Rounded, so that layouts whose simulated times differ only by float
  # rounding count as equally fast.
  lo = plan.layout
  # 'never' before 'always' on a tie: at M = 1 'always' recomputes nothing.
  return (not plan.fits, -float(f'{plan.examples_per_sec:.9g}'),
          lo.num_micro_batches * lo.num_virtual_stages, plan.memory_bytes,
          lo.num_partitions, lo.schedule, lo.remat != 'never', lo.remat)


def Best(plans: Sequence[Plan]) -> Plan:
  """The first plan of Rank's order that fits.

  Raises:
    PlanError: none fits; the message names the smallest plan.
  """
  if not plans:
    raise PlanError('No layout to consider: the global batch must be a '
                    'multiple of D / K for some K dividing D.')
  if plans[0].fits:
    return plans[0]
  small = min(plans, key=lambda p: p.memory_bytes)
  raise PlanError(
      f'No layout fits the memory budget; the smallest, '
      f'{small.layout.Label()}, needs {small.memory_bytes / MIB:.1f} MiB on '
      'its fullest device: raise the budget to at least that, or use more '
      'devices or a smaller batch.')


def Reason(plans: Sequence[Plan], budget_bytes: float | None) -> str:
  """Why the first plan (Best) won, in a few sentences."""
  best = Best(plans)
  fitting = [p for p in plans if p.fits]
  within = ('of all' if budget_bytes is None else
            f'within {budget_bytes / MIB:.1f} MiB per device, of')
  lines = [f'Recommended {best.layout.Label()}: the highest estimated '
           f'throughput {within} {len(fitting)} plans; simulated bubble '
           f'{best.bubble_fraction:.3f}, {best.memory_bytes / MIB:.1f} MiB on '
           'its fullest device.']
  if len(fitting) > 1:
    nxt = fitting[1]
    gap = 1 - nxt.examples_per_sec / best.examples_per_sec
    if gap > 1e-9:
      why = f'{100 * gap:.1f}% slower'
    elif _Order(nxt)[2] > _Order(best)[2]:
      why = 'as fast with more micro-batches'
    elif nxt.memory_bytes > best.memory_bytes:
      why = f'as fast but {nxt.memory_bytes / MIB:.1f} MiB'
    else:
      why = "a tie, broken by K, schedule name and remat ('never' first)"
    lines.append(f'Next: {nxt.layout.Label()}, {why}.')
  unbounded = min(plans, key=lambda p: _Order(dataclasses.replace(p,
                                                                   fits=True)))
  if unbounded is not best:
    speed = unbounded.examples_per_sec / best.examples_per_sec
    lines.append(
        f'Memory decided it: without the budget {unbounded.layout.Label()} '
        f'would come first ({speed:.2f}x as fast) but needs '
        f'{unbounded.memory_bytes / MIB:.1f} MiB.')
  return '\n'.join(lines)


def FormatTable(plans: Sequence[Plan], top: int = 10) -> str:
  """The first ``top`` plans that fit, as a markdown table."""
  fitting = [p for p in plans if p.fits][:top] if top else plans
  base = fitting[0].examples_per_sec if fitting else 1.0
  lines = ['| # | K | R | M | schedule | V | remat | est. examples/sec | '
           'vs #1 | bubble | MiB, fullest device (most params + most step) |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for i, p in enumerate(fitting):
    lo = p.layout
    lines.append(
        f'| {i + 1} | {lo.num_partitions} | {lo.num_replicas} | '
        f'{lo.num_micro_batches} | {lo.schedule} | {lo.num_virtual_stages} | '
        f'{lo.remat} | {_Rate(p.examples_per_sec)} | '
        f'{p.examples_per_sec / base:.2f} | {p.bubble_fraction:.3f} | '
        f'{p.memory_bytes / MIB:.1f} ({max(p.static_bytes) / MIB:.1f} + '
        f'{max(p.step_bytes) / MIB:.1f}) |')
  return '\n'.join(lines)


def _Rate(examples_per_sec: float) -> str:
  return (f'{examples_per_sec:,.0f}' if examples_per_sec >= 100 else
          f'{examples_per_sec:.3g}')
