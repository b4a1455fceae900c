"""Greedy list scheduling under a memory limit: one schedule built by running the step in simulated time.

The zero-bubble paper's automatic scheduler (Qi et al., ICLR 2024, section 4)
in its simple form. Time runs forward; whenever a device is free it starts
the first of

    1. the backward that is ready on it (of its latest stage first: a
       backward feeds the stage before it, which waits for it), split into B
       and a deferred W when `split` and the memory limit allow the W's
       stash, else a whole BW;
    2. the forward that is ready on it; a forward of the device's first
       stage admits a new micro-batch, which needs fewer than caps[d]
       micro-batches inside the device (the warm-up depth) and room within
       the memory limit for it, for its forwards at the device's later
       stages (reserved until they run, or room for one of them:
       `reserve_each`) and for what a backward adds while it runs; a
       forward at a later stage runs where the memory limit leaves room;
    3. a deferred W, oldest first: at once with `fill_weights` (W fills any
       gap), else only once the device has no forward left or its forwards
       are held back by memory (the W then frees its stash);

and otherwise waits for the next action anywhere to end. The device lists
this produces, replayed by the simulator with the same durations, start
every action at the moment it started here (and so the memory counted here
is what schedule.memory models), unless the pass held a device back that
the lists cannot: a `pace`, or a W kept for the cool-down while the device
idles. The simulator then starts those sooner; synthesize.py times and
checks every list with the simulator and the memory model, and uses the
makespan here only to rank. Remat's recompute is charged to every backward
here, spread over the stage's backwards by synthesize.Evaluate.

This module deliberately does not pick the parameters or check the result;
synthesize.py searches over both and keeps what fits.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import collections
import dataclasses
import heapq
import math
from typing import NamedTuple

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import memory

__all__ = ['Built', 'Build', 'Options']

Action = action_lib.Action
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class Options:
  """How the greedy pass chooses (see the module docstring).

  Attributes:
    stage_devices: stage_devices[s], the device of stage s.
    caps: per device, the most micro-batches inside it at once (admitted by
      its first stage's forward, out once that stage's backward ends); None:
      memory alone decides.
    pace: the first stage starts micro-batch m no sooner than m x pace: a
      steady flow in place of a burst that fills memory, then stalls
      (0: as soon as it can).
    split: split backwards into B and a deferred W where memory allows.
    deep_first: of two ready forwards on a device, run the later stage's
      (a micro-batch finishes sooner) rather than the earlier's.
    fill_weights: run a deferred W whenever nothing else is ready.
    reserve_each: admitting a micro-batch reserves room for its forwards at
      the device's later stages until they run (never stuck for memory, but
      a device holds fewer micro-batches); False keeps room for one such
      forward only (a V-shaped device's last stage runs its backward right
      after its forward, so one is often enough; may get stuck).
  """
  stage_devices: tuple[int, ...]
  caps: tuple[int, ...] | None
  split: bool
  deep_first: bool = True
  fill_weights: bool = True
  reserve_each: bool = True
  pace: float = 0.0


class Built(NamedTuple):
  """What the greedy pass made: the device lists and when its last action ended."""
  actions: list[list[Action]]
  makespan: float


def Build(num_micro_batches: int, forward: Sequence[float],
          backward: Sequence[float], weight: Sequence[float],
          stage_bytes: Sequence[memory.StageBytes], recompute: bool,
          comm_time: float, limits: Sequence[float],
          options: Options) -> Built | None:
  """Runs the greedy pass; returns each device's action list, or None if stuck.

  Args:
    num_micro_batches: M.
    forward, backward, weight: per stage, the durations of F, B and W (BW
      takes B + W); with `recompute`, B and BW take F longer as well.
    stage_bytes: per stage, its sizes (schedule.memory.StageBytes).
    recompute: forwards keep only their input and the backward rebuilds the
      activations (remat), instead of keeping them.
    comm_time: delay between an action ending and its consumer starting on
      another device.
    limits: per device, the step bytes (gradient sums and activations,
      weights excluded) it may hold; float('inf') for no limit.
    options: the choices above.

  Returns:
    The Built lists and makespan, or None when at some moment no device
    runs or can start anything (the memory limit or the caps starve it).
  """
  placed = options.stage_devices
  num_s, num_m, num_k = len(placed), num_micro_batches, len(limits)
  on = [[s for s in range(num_s) if placed[s] == d] for d in range(num_k)]
  latest_first = [sorted(stages, reverse=True) for stages in on]
  forward_order = latest_first if options.deep_first else on
  first = [min(stages) if stages else -1 for stages in on]
  back_time = [b + (f if recompute else 0.0) for f, b in zip(forward, backward)]
  hold = [st.input + (st.pinned if recompute else st.activations)
          for st in stage_bytes]
  rebuilt = [st.activations if recompute else 0.0 for st in stage_bytes]
  stash = [st.wcut - h for st, h in zip(stage_bytes, hold)]
  # The most a backward or W adds while it runs, on each device.
  spare = [max([stage_bytes[s].gradients + rebuilt[s] for s in stages] or [0.0])
           for stages in on]
  held = [sum(stage_bytes[s].gradients for s in stages) for stages in on]
  caps = options.caps or [num_m] * num_k
  # What the micro-batches inside a device will hold at its later stages:
  # admitting one reserves it (reserve_each), so that its later forwards
  # always find room; else room for one of them is kept free.
  reserved = [0.0] * num_k
  later = [sum(hold[s] for s in stages if s != first[d])
           for d, stages in enumerate(on)]
  room = later if options.reserve_each else [
      max([hold[s] for s in stages if s != first[d]] or [0.0])
      for d, stages in enumerate(on)]
  limit = [x + _EPS for x in limits]
  next_f, next_b = [0] * num_s, [0] * num_s
  f_ready = [[math.inf] * num_m for _ in range(num_s)]  # Input at the next
  b_ready = [[math.inf] * num_m for _ in range(num_s)]  # stage's device.
  f_done = [[False] * num_m for _ in range(num_s)]
  inside = [0] * num_k
  pending = [collections.deque() for _ in range(num_k)]
  rows = [[] for _ in range(num_k)]
  free = [0.0] * num_k
  running, seq, makespan = [], 0, 0.0
  times = [m * options.pace for m in range(num_m)] if options.pace else [0.0]
  heapq.heapify(times)

  def Choose(d: int, t: float) -> tuple[str, int, int] | None:
    now = held[d] + reserved[d]
    for s in latest_first[d]:  # A ready backward, of the latest stage.
      m = next_b[s]
      if m < num_m and f_done[s][m] and (
          s == num_s - 1 or b_ready[s + 1][m] <= t + _EPS):
        fits = (now + rebuilt[s] <= limit[d] and
                now + stash[s] + spare[d] <= limit[d])
        return (B if options.split and fits else BW), s, m
    squeezed = False
    for s in forward_order[d]:  # A ready forward that fits.
      m = next_f[s]
      if m >= num_m or (s and f_ready[s - 1][m] > t + _EPS) or (
          not s and m * options.pace > t + _EPS):
        continue
      if s == first[d]:
        if now + hold[s] + room[d] + spare[d] > limit[d]:
          squeezed = True
          continue
        if inside[d] >= caps[d]:
          continue
      elif not options.reserve_each and (
          held[d] + hold[s] + spare[d] > limit[d]):
        continue
      return F, s, m
    if pending[d] and (options.fill_weights or squeezed or all(
        next_f[s] >= num_m for s in on[d])):
      return (W,) + pending[d].popleft()
    return None

  def Start(d: int, kind: str, s: int, m: int, t: float) -> None:
    nonlocal seq, makespan
    rows[d].append(Action(kind, s, m))
    if kind == F:
      next_f[s] += 1
      held[d] += hold[s]
      if s == first[d]:
        inside[d] += 1
        reserved[d] += later[d] if options.reserve_each else 0.0
      elif options.reserve_each:
        reserved[d] -= hold[s]
      length = forward[s]
    elif kind == W:
      length = weight[s]
    else:
      next_b[s] += 1
      length = back_time[s] + (weight[s] if kind == BW else 0.0)
    end = free[d] = t + length
    makespan = max(makespan, end)
    seq += 1
    heapq.heappush(running, (end, seq, d, kind, s, m))
    heapq.heappush(times, end)
    if comm_time:
      heapq.heappush(times, end + comm_time)

  def End(d: int, kind: str, s: int, m: int, t: float) -> None:
    if kind == W:
      held[d] -= stage_bytes[s].wcut
      return
    if kind == F:
      f_done[s][m] = True
      if s + 1 < num_s:
        f_ready[s][m] = t + (comm_time if placed[s + 1] != d else 0.0)
      return
    if s:
      b_ready[s][m] = t + (comm_time if placed[s - 1] != d else 0.0)
    held[d] -= hold[s]
    if s == first[d]:
      inside[d] -= 1
    if kind == B:
      held[d] += stage_bytes[s].wcut
      pending[d].append((s, m))

  t = 0.0
  while True:
    while running and running[0][0] <= t + _EPS:
      end, _, d, kind, s, m = heapq.heappop(running)
      End(d, kind, s, m, end)
    started = False
    for d in range(num_k):
      if free[d] <= t + _EPS:
        chosen = Choose(d, t)
        if chosen:
          Start(d, *chosen, t)
          started = True
    if started:
      continue  # A zero-length W may already have ended.
    while times and times[0] <= t + _EPS:
      heapq.heappop(times)
    if not times:  # Nothing runs and no input is on its way.
      finished = all(n >= num_m for n in next_b) and not any(pending)
      return Built(rows, makespan) if finished else None
    t = times[0]
