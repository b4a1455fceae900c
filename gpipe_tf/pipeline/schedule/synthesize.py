"""Synthesize: the fastest schedule found for given stage costs within a memory budget per device.

Given K devices with V stages each, M micro-batches, every stage's F, B and W
durations, the boundary transfer time, every stage's sizes
(schedule.memory.StageBytes) and the remat policy, Synthesize() builds
candidates, times each with the simulator (simulate.Simulate), models each
device's peak bytes with the memory model (memory.Profile: weights plus the
step's gradient sums and activations, the figure a budget in bytes per device
is compared with), drops those over the budget and returns the fastest:

    candidates
      library    every registered schedule that exists for K, M, V
                 (gpipe, 1f1b, zb_h1; interleaved_1f1b, zbv, dualpipe_v)
      blocks     for V = 2, the controllable-memory building blocks
                 (controllable.Families: V-Half, V-Min and their kin)
      greedy     greedy.Build, the zero-bubble paper's list scheduling
                 under the memory limit, over a grid of its choices:
                 placement (stage s on s % K; for V = 2 also the V shape),
                 whole or split backwards, warm-up depths (1F1B's K - d + e,
                 uniform, or memory alone), W filling gaps or held for
                 the cool-down, depth- or breadth-first forwards
    keep         the shortest simulated step that fits; ties to the lower
                 peak, then to a library schedule (the greedy schedules
                 are timed in the order of the greedy pass's own makespan,
                 until 4 fit or 24 were timed)

The library schedules are candidates, so the result is never slower in the
simulator than the best of them that fits. With a budget of 1F1B's peak the
greedy pass finds ZB-H1-like schedules (W fills the cool-down), with half of
it schedules that hold fewer micro-batches, beside the controllable-memory
V-shaped schedules of Qi et al. 2024 (controllable.py). A budget
nothing fits raises MemoryBudgetError with the smallest budget a candidate
needs.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import itertools
import math
import numbers

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import controllable
from gpipe_tf.pipeline.schedule import greedy
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import simulate
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import vshape

__all__ = ['Candidate', 'Evaluate', 'LibraryCandidates', 'MemoryBudgetError',
           'Problem', 'Synthesize', 'Synthesized']

Action = action_lib.Action
Schedule = table.Schedule
ScheduleError = action_lib.ScheduleError
F = action_lib.F


class MemoryBudgetError(ScheduleError):
  """No candidate schedule fits the memory budget; the message gives the smallest that fits."""

  def __init__(self, message: str, smallest: float):
    super().__init__(message)
    self.smallest = smallest


@dataclasses.dataclass(frozen=True)
class Problem:
  """What a schedule is synthesized for: sizes, per-stage costs and bytes.

  Build with Problem.Make, which checks and broadcasts. S = K x V stages.

  Attributes:
    num_devices: K.
    num_micro_batches: M.
    num_virtual_stages: V, stages per device.
    forward, backward, weight: per stage, the duration of F, B (input
      gradient) and W (weight gradients); BW takes B + W, and a backward
      that recomputes its forward (remat) F longer, spread as
      tools/plan/lib.py does.
    stage_bytes: per stage, its schedule.memory.StageBytes.
    comm_time: added when an input comes from another device.
    remat: the remat policy (memory.REMATS) the memory model applies.
  """
  num_devices: int
  num_micro_batches: int
  num_virtual_stages: int
  forward: tuple[float, ...]
  backward: tuple[float, ...]
  weight: tuple[float, ...]
  stage_bytes: tuple[memory.StageBytes, ...]
  comm_time: float = 0.0
  remat: str = 'never'

  @classmethod
  def Make(cls, num_devices: int, num_micro_batches: int,
           forward: float | Sequence[float], backward: float | Sequence[float],
           weight: float | Sequence[float],
           stage_bytes: memory.StageBytes | Sequence[memory.StageBytes] | None = None,
           num_virtual_stages: int = 1, comm_time: float = 0.0,
           remat: str = 'never') -> 'Problem':
    """Checks the inputs; a number (or one StageBytes) stands for every stage.

    stage_bytes None: each stage's micro-batch holds one unit
    (StageBytes(activations=1)), so budgets count stage-micro-batches.

    Raises:
      ScheduleError: a size that is not an int >= 1, a duration that is not
        a finite number (> 0; W and comm_time >= 0), a list of the wrong
        length (S = K x V) or an unknown remat.
    """
    for value, name in ((num_devices, 'num_devices'),
                        (num_micro_batches, 'num_micro_batches'),
                        (num_virtual_stages, 'num_virtual_stages')):
      action_lib.CheckIndex(value, name, minimum=1)
    num_s = num_devices * num_virtual_stages
    if remat not in memory.REMATS:
      raise ScheduleError(f'remat must be one of {memory.REMATS}, got {remat!r}')
    if stage_bytes is None:
      stage_bytes = memory.StageBytes(activations=1.0)
    if isinstance(stage_bytes, memory.StageBytes):
      stage_bytes = [stage_bytes] * num_s
    if len(stage_bytes) != num_s:
      raise ScheduleError(f'give one StageBytes per stage: K x V = {num_s} '
                          f'stages, got {len(stage_bytes)}')
    per = simulate.PerStage
    return cls(num_devices, num_micro_batches, num_virtual_stages,
               tuple(per(forward, num_s, 'forward')),
               tuple(per(backward, num_s, 'backward')),
               tuple(per(weight, num_s, 'weight', allow_zero=True)),
               tuple(stage_bytes),
               per(comm_time, 1, 'comm_time', allow_zero=True)[0], remat)

  @property
  def num_stages(self) -> int:
    """S = K x V."""
    return self.num_devices * self.num_virtual_stages


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One evaluated schedule.

  Attributes:
    schedule: the schedule (validated).
    source: where it came from: a library name, or 'greedy(...)' and its
      choices.
    makespan: its simulated step.
    peaks: per device, the memory model's peak bytes (weights included).
    library: whether it is a registered library schedule.
  """
  schedule: Schedule
  source: str
  makespan: float
  peaks: tuple[float, ...]
  library: bool

  def Fits(self, budget: Sequence[float]) -> bool:
    """Whether every device's peak is within its budget."""
    return all(p <= b * (1 + 1e-9) for p, b in zip(self.peaks, budget))


@dataclasses.dataclass(frozen=True)
class Synthesized:
  """Synthesize's answer.

  Attributes:
    best: the chosen candidate (best.schedule is the schedule to run).
    best_library: the fastest library schedule that fits, or None.
    budget: per device, the budget it was chosen under.
    evaluated: how many distinct candidates were timed.
  """
  best: Candidate
  best_library: Candidate | None
  budget: tuple[float, ...]
  evaluated: int

  @property
  def schedule(self) -> Schedule:
    """The chosen schedule."""
    return self.best.schedule


def Evaluate(problem: Problem, schedule: Schedule, source: str = 'custom',
             is_library: bool = False) -> Candidate:
  """Times a schedule and models its memory under the problem's costs.

  A backward of stage s takes B_s + r_s F_s, r_s the share of the stage's
  micro-batches remat recomputes (memory.KeptForwards), as tools/plan/lib.py
  charges it.

  Raises:
    ScheduleError: the schedule is invalid or its sizes differ from the
      problem's.
  """
  if (schedule.num_devices, schedule.num_stages,
      schedule.num_micro_batches) != (problem.num_devices, problem.num_stages,
                                      problem.num_micro_batches):
    raise ScheduleError(
        f'schedule {schedule.name!r} has {schedule.num_devices} devices, '
        f'{schedule.num_stages} stages and {schedule.num_micro_batches} '
        f'micro-batches; the problem {problem.num_devices}, '
        f'{problem.num_stages} and {problem.num_micro_batches}')
  kept = memory.KeptForwards(schedule, problem.remat)
  num_m = problem.num_micro_batches
  shares = [sum((s, m) not in kept for m in range(num_m)) / num_m
            for s in range(problem.num_stages)]
  sim = simulate.Simulate(
      schedule, problem.forward,
      [b + r * f for b, r, f in zip(problem.backward, shares, problem.forward)],
      problem.weight, problem.comm_time)
  prof = memory.Profile(schedule, problem.stage_bytes, kept, sim)
  return Candidate(schedule, source, sim.makespan, prof.peak, is_library)


def LibraryCandidates(problem: Problem) -> list[Candidate]:
  """Every registered schedule that exists for the problem's K, M and V, evaluated."""
  out = []
  for name in library.Names():
    try:
      sched = library.Make(name, problem.num_devices,
                           problem.num_micro_batches,
                           problem.num_virtual_stages)
    except ScheduleError:
      continue  # Not for this V (or M): e.g. zbv needs V = 2.
    out.append(Evaluate(problem, sched, name, is_library=True))
  return out


def _Placements(problem: Problem) -> list[tuple[str, tuple[int, ...]]]:
  k, v = problem.num_devices, problem.num_virtual_stages
  out = [('looped' if v > 1 else '', tuple(s % k for s in range(k * v)))]
  if v == 2:
    out.append(('v-shape', tuple(vshape.VStageDevices(k))))
  return out


def _Caps(k: int) -> list[tuple[str, tuple[int, ...] | None]]:
  """Warm-up depths: 1F1B's K - d plus e, uniform, or memory alone."""
  out = [(f'1f1b+{e}', tuple(k - d + e for d in range(k)))
         for e in sorted({0, 1, 2, k})]
  out += [(f'uniform {u}', (u,) * k) for u in sorted({k, 2 * k})]
  return out + [('memory', None)]


def _GreedyChoices(problem: Problem, budget: Sequence[float]):
  """Yields (choices, step limits per device, greedy.Options) over the grid."""
  several = problem.num_virtual_stages > 1
  for placement_name, placement in _Placements(problem):
    weights = [sum(problem.stage_bytes[s].weights for s, dd in
                   enumerate(placement) if dd == d)
               for d in range(problem.num_devices)]
    limits = [b - w for b, w in zip(budget, weights)]
    # A device's work per micro-batch, the slowest's: the steady pace.
    pace = max(sum(problem.forward[s] + problem.backward[s] + problem.weight[s]
                   for s, dd in enumerate(placement) if dd == d)
               for d in range(problem.num_devices))
    for split, deep, fill, each, paced in itertools.product(
        (False, True), (True, False) if several else (True,),
        (True, False), (True, False) if several else (True,), (False, True)):
      if fill and not split:
        continue  # No W to place.
      for cap_name, caps in _Caps(problem.num_devices):
        yield ((placement_name, split, deep, fill, each, paced, cap_name),
               limits, greedy.Options(placement, caps, split, deep, fill,
                                      each, pace if paced else 0.0))


def _Leanest(problem: Problem):
  """Yields (key, Candidate): one micro-batch inside each device at a time,
  whole backwards, no memory limit; per placement."""
  k = problem.num_devices
  for placement_name, placement in _Placements(problem):
    options = greedy.Options(placement, (1,) * k, split=False)
    built = greedy.Build(
        problem.num_micro_batches, problem.forward, problem.backward,
        problem.weight, problem.stage_bytes, problem.remat != 'never',
        problem.comm_time, [math.inf] * k, options)
    sched = Schedule(built.actions, problem.num_micro_batches, placement,
                     name='synthesized')
    choices = (placement_name, False, True, False, True, False, 'one')
    yield ((sched.actions, placement),
           Evaluate(problem, sched, _Label(choices)))


def _Label(choices: tuple) -> str:
  placement, split, deep, fill, each, paced, caps = choices
  parts = [p for p in (placement,) if p]
  parts.append('B/W' if split else 'BW')
  if split:
    parts.append('W fills gaps' if fill else 'W in cool-down')
  if placement:
    parts.append('depth-first' if deep else 'breadth-first')
    parts.append('room for each' if each else 'room for one')
  parts.append(f'warm-up {caps}')
  if paced:
    parts.append('paced')
  return f"greedy({', '.join(parts)})"


def _Key(c: Candidate) -> tuple:
  # Rounded: steps that differ by float rounding tie.
  return (float(f'{c.makespan:.9g}'), float(f'{max(c.peaks):.9g}'),
          not c.library, c.source)


def _Budget(problem: Problem,
            memory_budget: float | Sequence[float] | None) -> tuple[float, ...]:
  k = problem.num_devices
  if memory_budget is None:
    return (math.inf,) * k
  values = (list(memory_budget) if isinstance(memory_budget, Sequence)
            else [memory_budget] * k)
  if len(values) != k or not all(
      isinstance(b, numbers.Real) and not isinstance(b, bool) and b > 0
      for b in values):
    raise ScheduleError(f'memory_budget must be a number > 0 (bytes per '
                        f'device) or {k} of them, got {memory_budget!r}')
  return tuple(float(b) for b in values)


def Synthesize(problem: Problem,
               memory_budget: float | Sequence[float] | None = None,
               search: bool = True) -> Synthesized:
  """The fastest schedule found that fits the budget on every device.

  Args:
    problem: sizes and costs (Problem.Make).
    memory_budget: bytes per device, in the units of problem.stage_bytes,
      compared with memory.Profile's peak (weights included); one number
      for every device or one per device; None: no limit.
    search: also run the greedy search (False: library schedules only).

  Returns:
    The Synthesized: its best.schedule validates, fits the budget in the
    memory model and simulates no slower than best_library.

  Raises:
    MemoryBudgetError: no candidate fits; the message and .smallest give
      the least budget (bytes on the fullest device) one of them needs.
    ScheduleError: a bad budget.
  """
  budget = _Budget(problem, memory_budget)
  found = {}
  for cand in LibraryCandidates(problem):
    found.setdefault((cand.schedule.actions, cand.schedule.stage_devices), cand)
  if search and problem.num_virtual_stages == 2:
    for name, sched in controllable.Families(problem.num_devices,
                                             problem.num_micro_batches):
      found.setdefault((sched.actions, sched.stage_devices),
                       Evaluate(problem, sched, name))
  built = {}
  for choices, limits, options in (_GreedyChoices(problem, budget) if search
                                   else ()):
    result = greedy.Build(
        problem.num_micro_batches, problem.forward, problem.backward,
        problem.weight, problem.stage_bytes, problem.remat != 'never',
        problem.comm_time, limits, options)
    if result is not None:
      key = (tuple(map(tuple, result.actions)), options.stage_devices)
      built.setdefault(key, (result.makespan, choices))
  # Timing and modelling a schedule costs more than building it: the
  # simulator and memory model see the greedy ones in the order of the
  # greedy pass's own makespan, until _KEEP of them fit or _TIMED ran.
  fits = timed = 0
  for key, (_, choices) in sorted(built.items(), key=lambda kv: kv[1][0]):
    if key in found:
      continue
    if fits >= _KEEP or timed >= _TIMED:
      break
    timed += 1
    sched = Schedule(key[0], problem.num_micro_batches, key[1],
                     name='synthesized')
    found[key] = Evaluate(problem, sched, _Label(choices))
    fits += found[key].Fits(budget)
  fitting = sorted((c for c in found.values() if c.Fits(budget)), key=_Key)
  if not fitting and search:
    # The greedy pass's own accounting keeps room a schedule may not need:
    # one micro-batch at a time, whatever the limit, is the leanest it makes.
    for key, cand in _Leanest(problem):
      found.setdefault(key, cand)
    fitting = sorted((c for c in found.values() if c.Fits(budget)), key=_Key)
  if not fitting:
    leanest = min(found.values(), key=lambda c: (max(c.peaks), c.makespan))
    need = max(leanest.peaks)
    raise MemoryBudgetError(
        f'no schedule of K={problem.num_devices}, M={problem.num_micro_batches}'
        f', V={problem.num_virtual_stages} found within the memory budget of '
        f'{_Bytes(max(budget))} per device (remat {problem.remat!r}): the '
        f'leanest, {leanest.source}, needs {_Bytes(need)} on its fullest '
        f'device. Raise the budget to at least {need:.6g}, or use remat, '
        'more devices or smaller micro-batches.', need)
  best_library = next((c for c in fitting if c.library), None)
  return Synthesized(fitting[0], best_library, budget, len(found))


# Greedy schedules that fit, and greedy schedules timed, before the search
# stops.
_KEEP = 4
_TIMED = 24


def _Bytes(value: float) -> str:
  return 'unlimited' if math.isinf(value) else f'{value:.6g}'
