"""Models the bytes every device holds at every moment of a schedule's step: weights, gradient sums, activations.

Beside the simulator (simulate.py), which says when each action runs, this
module says what each device holds meanwhile, from a few sizes per stage
(StageBytes: per micro-batch, the stage's boundary input, the activations a
kept forward saves, the non-trainable values a recomputed forward rereads
and what a deferred W reads; per step, the weights and gradient sums) and
the remat choice (which (stage, micro-batch) pairs keep their forward). On
the device of stage s, micro-batch m holds::

    from the start of F(s, m) to the end of its backward (BW, or B if split)
        input + activations          the forward is kept
        input + pinned               the forward is recomputed ...
    during its B or BW
        + activations                ... by the backward, which rebuilds them
    during its BW or W (any piece that makes weight gradients)
        + gradients                  added to the sums when the piece returns
    from the end of B(s, m) to the end of W(s, m)   (split backward only)
        wcut                         layer inputs and output gradients

and the stage's gradient sums from the end of its first piece that makes
weight gradients (the engine's sums start as that piece's gradients, with
nothing before them) to the end of the step; its weights for the whole step
(allocated before it: ``step_peak`` leaves them out). A
release at time t comes before a hold at t. GPipe (K = 2, M = 4, every
forward kept, unit times) thus holds on device 0 four micro-batches at the
end of its forwards; 1F1B at most K - d on device d::

    gpipe  dev 0: F0 F1 F2 F3 .. ..  BW3 BW3 BW2 ...   4 x (input + activations)
    1f1b   dev 0: F0 F1 .. BW0 BW0 F2 ...              2 x (input + activations)

A running backward's weight gradients are all counted from its start: the
engine adds them to the sums once the piece returns, and its stashed
activations are freed then too (a profile of a 1F1B Transformer step shows
both alive together at the peak: benchmarks/benchmark), so the moment before
the add is the piece's largest. Deliberately NOT modelled: the output
gradient waiting for its backward, an input between its arrival and its F,
the backward's other temporary buffers, the loss, copies between devices and
the allocator's fragmentation.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import simulate as simulate_lib
from gpipe_tf.pipeline.schedule import table

__all__ = ['REMATS', 'MemoryProfile', 'KeptForwards', 'Profile', 'StageBytes',
           'StageBytesOf']

Action = action_lib.Action
ScheduleError = action_lib.ScheduleError
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
FB = action_lib.FB
REMATS = ('never', 'always', 'except_last')


@dataclasses.dataclass(frozen=True)
class StageBytes:
  """The bytes one stage holds: per micro-batch, and for the whole step.

  Attributes:
    input: its boundary input (the previous stage's output), per micro-batch.
    activations: what a kept forward saves for its backward beyond the
      input (every layer's outputs), per micro-batch; a recomputing backward
      rebuilds as much.
    wcut: what a deferred W reads, stashed by its B (layer inputs and
      output gradients), per micro-batch.
    pinned: the non-trainable values a recomputed forward must reread
      (BatchNorm's moving statistics), per micro-batch.
    weights: the stage's weights and optimizer slots.
    gradients: the stage's gradient sums.
  """
  input: float = 0.0
  activations: float = 0.0
  wcut: float = 0.0
  pinned: float = 0.0
  weights: float = 0.0
  gradients: float = 0.0


def StageBytesOf(input_bytes: float, output_bytes: Sequence[float],
                 num_params: int, micro_batch_size: int,
                 bytes_per_param: float = 4.0,
                 grad_bytes_per_param: float = 4.0,
                 kept_bytes: Sequence[float | None] | None = None,
                 wcut_bytes: Sequence[float | None] | None = None
                 ) -> StageBytes:
  """A stage's StageBytes from its layers' sizes per example.

  Args:
    input_bytes: bytes per example of the stage's input.
    output_bytes: bytes per example of each of its layers' outputs, in order.
    num_params: parameters of its layers.
    micro_batch_size: examples per micro-batch.
    bytes_per_param: weight and optimizer-slot bytes per parameter.
    grad_bytes_per_param: gradient bytes per parameter.
    kept_bytes: per layer, the bytes per example its kept forward stashes
      for its backward beyond its inputs (None, or no list: its outputs).
    wcut_bytes: per layer, the bytes per example its B stashes for its W
      (None, or no list: its input and its output's gradient).

  Returns:
    The StageBytes: activations are the kept bytes, wcut the wcut bytes
    (by default the layers' outputs; their inputs plus as many output
    gradients as outputs); nothing pinned.
  """
  b, outs = micro_batch_size, list(output_bytes)
  ins = [input_bytes] + outs[:-1]
  kept = [o if k is None else k
          for o, k in zip(outs, kept_bytes or [None] * len(outs))]
  wcut = [i + o if w is None else w
          for i, o, w in zip(ins, outs, wcut_bytes or [None] * len(outs))]
  return StageBytes(input=input_bytes * b, activations=sum(kept) * b,
                    wcut=sum(wcut) * b,
                    weights=num_params * bytes_per_param,
                    gradients=num_params * grad_bytes_per_param)


def KeptForwards(schedule: table.Schedule,
                 remat: str) -> frozenset[tuple[int, int]]:
  """The (stage, micro-batch) pairs whose forward keeps its activations.

  Args:
    schedule: the schedule.
    remat: 'never' keeps every forward; 'always' only those whose backward
      directly follows them on their device
      (Schedule.ForwardsFollowedByBackward); 'except_last' those and the
      last micro-batch of every stage.

  Raises:
    ScheduleError: an unknown remat policy.
  """
  if remat not in REMATS:
    raise ScheduleError(f'remat must be one of {REMATS}, got {remat!r}')
  every = {(s, m) for s in range(schedule.num_stages)
           for m in range(schedule.num_micro_batches)}
  if remat == 'never':
    return frozenset(every)
  kept = set(schedule.ForwardsFollowedByBackward())
  if remat == 'except_last':
    kept |= {(s, schedule.num_micro_batches - 1)
             for s in range(schedule.num_stages)}
  return frozenset(kept)


@dataclasses.dataclass(frozen=True)
class MemoryProfile:
  """What every device holds over one step.

  Attributes:
    times: the moments the held bytes change, increasing, from 0.
    held: held[i][d], the step's bytes (gradient sums and activations)
      device d holds from times[i] until times[i + 1] (the last: until the
      step ends).
    weights: per device, the weights and optimizer slots, held before,
      during and after the step.
  """
  times: tuple[float, ...]
  held: tuple[tuple[float, ...], ...]
  weights: tuple[float, ...]

  @property
  def step_peak(self) -> tuple[float, ...]:
    """Per device, the most step bytes it holds at once."""
    return tuple(max(col) for col in zip(*self.held))

  @property
  def peak(self) -> tuple[float, ...]:
    """Per device, weights plus step_peak."""
    return tuple(w + p for w, p in zip(self.weights, self.step_peak))

  @property
  def total_step_peak(self) -> float:
    """The most step bytes all devices hold at one moment (one allocator's view)."""
    return max(sum(row) for row in self.held)

  @property
  def worst_time(self) -> float:
    """The first moment all devices together hold total_step_peak."""
    sums = [sum(row) for row in self.held]
    return self.times[sums.index(max(sums))]


def Profile(schedule: table.Schedule, stages: Sequence[StageBytes],
            kept: Iterable[tuple[int, int]],
            sim: simulate_lib.SimResult | None = None) -> MemoryProfile:
  """The bytes every device holds over a step (see the module docstring).

  Args:
    schedule: the schedule; it is validated.
    stages: one StageBytes per stage.
    kept: the (stage, micro-batch) pairs whose forward keeps its activations
      (KeptForwards); the others are recomputed by their backward.
    sim: when each action runs (Simulate); default Simulate(schedule), unit
      times (F, B, W one tick, BW two).

  Returns:
    The MemoryProfile.

  Raises:
    ScheduleError: an invalid schedule, or not one StageBytes per stage.
  """
  schedule.Validate()
  if len(stages) != schedule.num_stages:
    raise ScheduleError(f'give one StageBytes per stage: the schedule has '
                        f'{schedule.num_stages} stages, got {len(stages)}')
  sim = sim or simulate_lib.Simulate(schedule)
  kept = frozenset(kept)
  k = schedule.num_devices
  events = []
  first = {}  # Per stage, when its first weight gradients are made.
  for d, acts in enumerate(schedule.actions):
    for a in acts:
      defers_w = schedule.DefersW(a.stage, a.micro_batch)
      events += _Events(a, d, stages[a.stage], sim,
                        (a.stage, a.micro_batch) in kept, defers_w)
      if a.kind in (BW, W) or (a.kind == FB and not defers_w):
        first[a.stage] = min(first.get(a.stage, sim.end[a]), sim.end[a])
  events += [(first[s], st.gradients, schedule.DeviceOf(s))
             for s, st in enumerate(stages) if s in first]
  changes = {}
  for t, delta, d in events:
    changes.setdefault(t, []).append((delta, d))
  now, times, held = [0.0] * k, [], []
  for t in sorted(changes):
    for delta, d in changes[t]:
      now[d] += delta
    times.append(t)
    held.append(tuple(now))
  weights = [0.0] * k
  for s, st in enumerate(stages):
    weights[schedule.DeviceOf(s)] += st.weights
  return MemoryProfile(tuple(times), tuple(held), tuple(weights))


def _Events(a: Action, d: int, st: StageBytes, sim: simulate_lib.SimResult,
            keep: bool, defers_w: bool) -> list[tuple[float, float, int]]:
  """(time, bytes, device) holds (> 0) and releases (< 0) of one action."""
  forward = st.input + (st.activations if keep else st.pinned)
  start, end = sim.start[a], sim.end[a]
  if a.kind == F:
    return [(start, forward, d)]
  if a.kind == FB:  # Its activations live only while it runs.
    held = st.input + st.activations + (0.0 if defers_w else st.gradients)
    return [(start, held, d), (end, -held, d)] + (
        [(end, st.wcut, d)] if defers_w else [])
  events = []
  if a.kind in (BW, W):  # Its weight gradients, summed once it returns.
    events += [(start, st.gradients, d), (end, -st.gradients, d)]
  if a.kind in (B, BW):
    events.append((end, -forward, d))
    if not keep:  # The recompute, alive while the backward runs.
      events += [(start, st.activations, d), (end, -st.activations, d)]
  if a.kind == B:
    events.append((end, st.wcut, d))
  if a.kind == W:
    events.append((end, -st.wcut, d))
  return events
