"""Predicts a processes-mode row's step with the schedule simulator from F, B and W costs measured on the same workers.

``tools.benchmark --devices=processes --predict``. For every pipelined
training row:

  * **stages**: the row's cut of the blocks into K x V stages, as its
    PipeliningLayer makes it (tools.plan_lib.Evaluate's balance: FLOPs,
    weighted by each stage's recompute share);
  * **piece costs** (``MeasureCosts``, on the worker that runs the stage,
    pinned to its core): one micro-batch (N / M examples) through the stage's
    blocks, timed as a forward (F), a forward and its input gradient, and a
    forward and every gradient; B = the second minus F, BW = the third minus
    F, and W = BW - B (a weight gradient alone needs the output gradients, so
    it cannot be timed apart from B). Each is timed ``reps`` times in one
    call and the cost of an empty call on that worker is taken off;
  * **comm** (``MeasureComm``): one boundary tensor of a micro-batch sent
    back and forth between the two workers, per message;
  * **recompute**: with remat, a forward that is not kept
    (schedule.memory.KeptForwards) is redone by its backward: B and BW of
    stage s take r_s x F more, r_s the share of its micro-batches recomputed
    (as tools.plan_lib charges it);
  * ``Predict``: ``schedule.Simulate`` of the schedule as the engine runs it
    (``ticks.JoinBackward``: a B directly followed by its W is one BW) with
    those costs and comm between devices (BW = B + W by W's definition;
    where noise makes B > BW, W = 0 and BW takes B). Its makespan is the predicted step and its bubble the simulated
    one, beside the measured step and the measured bubble: 1 - each worker's
    CPU time per step over the step (``MeasuredBubble``).

Deliberately NOT modelled: the chief's dispatch of the step and the SGD
update (the measured step includes them), a device running two actions at
once (a worker with 2 inter-op threads may interleave the ops of two ready
actions; the simulator runs one at a time in the schedule's order), and a
split W costing more than BW - B (it re-reads what B left).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory as memory_lib
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = ['PieceCosts', 'StageCosts', 'RecomputeShares', 'StageCostsOf',
           'Predict', 'MeasuredBubble', 'Summary', 'MeasureCosts',
           'MeasureComm']


@dataclasses.dataclass(frozen=True)
class PieceCosts:
  """Seconds of one micro-batch through one stage's blocks, measured."""
  forward: float
  backward: float  # The input gradient alone (B).
  backward_weight: float  # Input and weight gradients in one pass (BW).

  @property
  def weight(self) -> float:
    """W = BW - B: what deferring the weight gradients leaves for later."""
    return max(self.backward_weight - self.backward, 0.0)


@dataclasses.dataclass(frozen=True)
class StageCosts:
  """Per-stage seconds the simulator takes (one value per stage), and comm."""
  forward: list[float]
  backward: list[float]
  weight: list[float]
  backward_weight: list[float]
  comm: float


def RecomputeShares(schedule: schedule_lib.Schedule, remat: str
                    ) -> list[float]:
  """Per stage, the share of its micro-batches whose forward its backward
  recomputes under ``remat`` (0 for 'never')."""
  kept = memory_lib.KeptForwards(schedule, remat)
  m = schedule.num_micro_batches
  return [sum((s, j) not in kept for j in range(m)) / m
          for s in range(schedule.num_stages)]


def StageCostsOf(pieces: Sequence[PieceCosts], shares: Sequence[float],
                 comm: float) -> StageCosts:
  """The simulator's per-stage costs: each stage's piece costs with its
  recompute share r of F added to B and BW."""
  tiny = 1e-9  # Simulate wants F, B and BW > 0.
  return StageCosts(
      forward=[max(p.forward, tiny) for p in pieces],
      backward=[max(p.backward + r * p.forward, tiny)
                for p, r in zip(pieces, shares)],
      weight=[p.weight for p in pieces],
      backward_weight=[max(p.backward + p.weight + r * p.forward, tiny)
                       for p, r in zip(pieces, shares)],
      comm=comm)


def Predict(schedule: schedule_lib.Schedule, costs: StageCosts
            ) -> schedule_lib.SimResult:
  """schedule.Simulate of the schedule as the engine runs it (a B directly
  followed by its W joined into one BW, taking B + W)."""
  return schedule_lib.Simulate(
      ticks_lib.JoinBackward(schedule), costs.forward, costs.backward,
      costs.weight, comm_time=costs.comm)


def MeasuredBubble(busy_seconds: Sequence[float], step_seconds: float
                   ) -> float:
  """1 - each device's busy time over the step, averaged over devices."""
  return 1.0 - sum(busy_seconds) / (len(busy_seconds) * step_seconds)


def Summary(schedule: schedule_lib.Schedule, remat: str,
            pieces: Sequence[PieceCosts], comm: float) -> dict:
  """What a row keeps: the stage costs, and the simulated step, bubble and
  busy time per device from them (seconds; lists per stage or device)."""
  shares = RecomputeShares(schedule, remat)
  costs = StageCostsOf(pieces, shares, comm)
  sim = Predict(schedule, costs)
  return dict(forward_seconds=costs.forward,
              backward_seconds=costs.backward, weight_seconds=costs.weight,
              backward_weight_seconds=costs.backward_weight,
              comm_seconds=comm, recompute_shares=shares,
              predicted_seconds=sim.makespan,
              simulated_bubble=sim.bubble_fraction,
              simulated_device_busy_seconds=sim.busy)


def _Seconds(fn, reps_done: int, calls: int = 5) -> float:
  """The median seconds of ``calls`` calls of ``fn`` (already warmed up)."""
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn().numpy()
    times.append(time.perf_counter() - start)
  return statistics.median(times) / reps_done


def MeasureCosts(layer, inputs: Sequence, device: str, reps: int = 4
                 ) -> PieceCosts:
  """Times F, F + input gradient and F + all gradients of ``layer`` (built,
  its variables on ``device``) on ``inputs`` (one micro-batch, on
  ``device``), ``reps`` times a call, less an empty call's cost.

  The loss is the mean square of the first output, as the benchmark's.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  variables = list(layer.trainable_variables)

  def _Pass(input_grad: bool, weight_grads: bool):
    @tf.function
    def _Run():
      with tf.device(device):
        total = tf.constant(0.0)
        for i in range(reps):
          # A different input per rep, so no rep is folded into another.
          x = (inputs[0] + tf.cast(i, inputs[0].dtype) * 1e-6,) + tuple(
              inputs[1:])
          with tf.GradientTape() as tape:
            tape.watch(x[0])
            out = layer.FProp(*x, training=True)
            y = out[0] if isinstance(out, tuple) else out
            loss = tf.reduce_mean(tf.square(y))
          targets = ([x[0]] if input_grad else []) + (
              variables if weight_grads else [])
          for g in tape.gradient(loss, targets) if targets else [loss]:
            total += tf.reduce_sum(g)
        return total
    _Run().numpy()  # Trace and warm up.
    return _Run

  @tf.function
  def _Empty():
    with tf.device(device):
      return tf.reduce_sum(inputs[0][:1])

  _Empty().numpy()
  empty = _Seconds(_Empty, reps)
  fwd = _Seconds(_Pass(False, False), reps) - empty
  fb = _Seconds(_Pass(True, False), reps) - empty
  fbw = _Seconds(_Pass(True, True), reps) - empty
  return PieceCosts(forward=max(fwd, 0.0), backward=max(fb - fwd, 0.0),
                    backward_weight=max(fbw - fwd, 0.0))


def MeasureComm(tensor, devices: Sequence[str], reps: int = 8) -> float:
  """Seconds per message of ``tensor`` (on devices[0]) sent to devices[1]
  and back ``reps`` times in one call, less a call without messages."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  # tf.reverse: an op the graph optimizer does not cancel in pairs (it
  # removes a negation of a negation, and with it the messages).
  @tf.function
  def _PingPong():
    z = tensor
    for i in range(2 * reps):
      with tf.device(devices[(i + 1) % 2]):
        z = tf.reverse(z, axis=[0])
    with tf.device(devices[0]):
      return tf.reduce_sum(z[:1])

  @tf.function
  def _Alone():
    z = tensor
    with tf.device(devices[0]):
      for _ in range(2 * reps):
        z = tf.reverse(z, axis=[0])
      return tf.reduce_sum(z[:1])

  _PingPong().numpy()
  _Alone().numpy()
  return max(_Seconds(_PingPong, 2 * reps) - _Seconds(_Alone, 2 * reps), 0.0)
