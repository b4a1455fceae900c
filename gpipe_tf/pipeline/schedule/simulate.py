"""Simulate: times a schedule with given pass durations; reports makespan, bubble and memory.

Every device runs its action list in order, each action as soon as the device
is free and its data dependencies have ended (plus comm_time when a
dependency ran on another device). F(s, m) takes forward_time, B
backward_time, W weight_time and BW backward_time + weight_time, each a number
or one number per stage. GPipe with F = B = W = 1 (so BW = 2) takes
makespan = 3 (M + K - 1), of which each device is busy 3 M:

    bubble_fraction = idle / (K * makespan) = (K - 1) / (M + K - 1)

This module deliberately does not model memory in bytes: peak_in_flight
counts (stage, micro-batch) pairs whose activations a device holds.
"""

from collections.abc import Sequence
import dataclasses
import math
import numbers

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import replay as replay_lib
from gpipe_tf.pipeline.schedule import table

__all__ = ['PerStage', 'SimResult', 'Simulate']

Action = action_lib.Action
ScheduleError = action_lib.ScheduleError
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
FB = action_lib.FB


@dataclasses.dataclass
class SimResult:
  """The timing of one simulated step.

  Attributes:
    makespan: end time of the last action (the first starts at 0).
    bubble_fraction: idle share of the K x makespan device-time area.
    busy: per device, the total duration of its actions.
    peak_in_flight: per device, the most (stage, micro-batch) pairs held at
      once; (s, m) is held from the start of F(s, m) to the end of BW(s, m),
      or of W(s, m) when the backward is split.
    start: start time of every action.
    end: end time of every action.
  """
  makespan: float
  bubble_fraction: float
  busy: list[float]
  peak_in_flight: list[int]
  start: dict[Action, float]
  end: dict[Action, float]


def PerStage(value: float | Sequence[float], num_stages: int, name: str,
             allow_zero: bool = False) -> list[float]:
  """A duration per stage from a number or a list; ScheduleError naming
  `name` unless every one is finite and > 0 (>= 0 with allow_zero)."""
  values = (list(value) if isinstance(value, Sequence) and not isinstance(value, str)
            else [value] * num_stages)
  ok = len(values) == num_stages and all(
      isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
      and (v >= 0 if allow_zero else v > 0) for v in values)
  if not ok:
    sign = '>= 0' if allow_zero else '> 0'
    raise ScheduleError(f'{name} must be a number {sign} or {num_stages} such '
                        f'numbers (one per stage), got {value!r}')
  return [float(v) for v in values]


def Simulate(schedule: table.Schedule,
             forward_time: float | Sequence[float] = 1.0,
             backward_time: float | Sequence[float] = 1.0,
             weight_time: float | Sequence[float] = 1.0,
             comm_time: float = 0.0) -> SimResult:
  """Times a schedule: each action starts once its device and its inputs are free.

  Args:
    schedule: the schedule; it is validated first.
    forward_time: duration of F, a number > 0 or one per stage.
    backward_time: duration of B (input gradient), > 0 or one per stage.
    weight_time: duration of W (weight gradient), >= 0 or one per stage. BW
      takes backward_time + weight_time.
    comm_time: delay >= 0 between a dependency ending on one device and its
      consumer starting on another.

  Returns:
    The SimResult.

  Raises:
    ScheduleError: if the schedule is invalid (see Schedule.Validate), or a
      duration is negative, not finite or a per-stage list of the wrong length.
  """
  schedule.Validate()
  num_s = schedule.num_stages
  times = {F: PerStage(forward_time, num_s, 'forward_time'),
           B: PerStage(backward_time, num_s, 'backward_time'),
           W: PerStage(weight_time, num_s, 'weight_time', allow_zero=True)}
  times[BW] = [b + w for b, w in zip(times[B], times[W])]
  comm = PerStage(comm_time, 1, 'comm_time', allow_zero=True)[0]

  def _Time(act):
    if act.kind != FB:
      return times[act.kind][act.stage]
    back = B if schedule.DefersW(act.stage, act.micro_batch) else BW
    return times[F][act.stage] + times[back][act.stage]

  replayed = replay_lib.Replay(schedule.actions, schedule.Dependencies,
                               _Time, comm)
  busy = [sum(replayed.end[a] - replayed.start[a] for a in acts)
          for acts in schedule.actions]
  makespan = replayed.makespan
  return SimResult(
      makespan=makespan,
      bubble_fraction=1.0 - sum(busy) / (schedule.num_devices * makespan),
      busy=busy,
      peak_in_flight=[_PeakInFlight(acts, replayed) for acts in schedule.actions],
      start=replayed.start, end=replayed.end)


def _PeakInFlight(acts: Sequence[Action], replayed: replay_lib.Replayed) -> int:
  """The most (s, m) held at once by one device; a release at t precedes a hold at t."""
  events = []
  split = {(a.stage, a.micro_batch) for a in acts if a.kind == W}
  for act in acts:
    if act.kind in (F, FB):
      events.append((replayed.start[act], 1))
    if act.kind in (W, BW) or (
        act.kind == FB and (act.stage, act.micro_batch) not in split):
      events.append((replayed.end[act], -1))
  held = peak = 0
  for _, delta in sorted(events):
    held += delta
    peak = max(peak, held)
  return peak
