"""Predicts a processes-mode row's step with the schedule replayed on F, B, W and BW costs measured on the same workers, as the engine runs them.

``tools.benchmark --devices=processes --predict``. For every pipelined
training row:

  * **stages**: the row's cut of the blocks into K x V stages, as its
    PipeliningLayer makes it (tools.plan.lib.Evaluate's balance: FLOPs,
    weighted by each stage's recompute share);
  * **piece costs** (``MeasureCosts``, on the worker that runs the stage,
    pinned to its core): one micro-batch (N / M examples) through the
    stage's blocks, each piece the engine's own (the stage's program,
    traced and pruned as the engine does: introspect.TraceCell): F, B
    (the input gradient, stashing what W reads), W (the weight gradients
    from what B stashed), BW (both in one pass), and with remat the B and
    BW that recompute their forward. Each piece is timed by the **worker's
    CPU time** (its threads' scheduler clocks, in ns): the least over
    several calls, less that of an empty call on the same worker. CPU time
    counts what the worker computed, not the time it waited for its core,
    so other load on the machine does not enter it; the minimum wall time
    per call is kept beside it (``wall``);
  * **comm** (``MeasureComm``): one boundary tensor of a micro-batch sent
    back and forth between two workers: the CPU time a message costs each
    side (``comm_cpu_seconds``, added to every action that sends or
    receives across a device boundary), and the rest of its fastest wall
    time per message, a delay between the devices (``comm_seconds``);
  * ``Predict``: the schedule as the engine runs it (``ticks.JoinBackward``:
    a B directly followed by its W is one BW; ``ticks.FuseLast``: the last
    stage's F and its backward are one FB) replayed action by action
    (``schedule.replay``), each action taking its own piece: a B or BW of a
    forward that was not kept (schedule.memory.KeptForwards) the
    recomputing one. Its makespan is the predicted step and its idle share
    the simulated bubble, beside the measured step and the measured bubble:
    1 - each worker's CPU time per step over the step (``MeasuredBubble``).

Deliberately NOT modelled: the chief's dispatch of the step and the SGD
update (the measured step includes them), and a device running two actions
at once (a worker with 2 inter-op threads may interleave the ops of two
ready actions; the replay runs one at a time in the schedule's order).
"""

from __future__ import annotations

import dataclasses
import glob
import time
from typing import Callable, Sequence

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory as memory_lib
from gpipe_tf.pipeline.schedule import replay as replay_lib
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = ['PieceCosts', 'Comm', 'Prediction', 'RecomputeShares',
           'EngineSchedule', 'ActionSeconds', 'Predict', 'MeasuredBubble',
           'Summary', 'ThreadCpuSeconds', 'MeasureCosts', 'PieceRuns',
           'MeasureComm']

F, B, W, BW, FB = (schedule_lib.F, schedule_lib.B, schedule_lib.W,
                   schedule_lib.BW, schedule_lib.FB)


@dataclasses.dataclass(frozen=True)
class PieceCosts:
  """Seconds of one micro-batch through one stage, each piece measured as
  the engine runs it.

  Attributes:
    forward: F.
    backward: B of a kept forward: the input gradient, stashing what W
      reads.
    weight: W: the weight gradients from what B stashed.
    backward_weight: BW of a kept forward: input and weight gradients in
      one pass.
    backward_remat: B that recomputes its forward first; None: B + F.
    backward_weight_remat: BW that recomputes its forward; None: BW + F.
  """
  forward: float
  backward: float
  weight: float
  backward_weight: float
  backward_remat: float | None = None
  backward_weight_remat: float | None = None

  def Backward(self, kind: str, kept: bool) -> float:
    """The seconds of a B or BW (``kind``) of a forward that was ``kept``
    (else recomputed)."""
    if kind == B:
      if kept:
        return self.backward
      return (self.backward + self.forward if self.backward_remat is None
              else self.backward_remat)
    if kept:
      return self.backward_weight
    return (self.backward_weight + self.forward
            if self.backward_weight_remat is None
            else self.backward_weight_remat)


@dataclasses.dataclass(frozen=True)
class Comm:
  """What one boundary message costs: a delay between the devices, and CPU
  time on the sending and on the receiving device."""
  seconds: float = 0.0
  cpu_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The replayed step: makespan, idle share, each device's busy seconds."""
  makespan: float
  bubble_fraction: float
  busy: list[float]


def RecomputeShares(schedule: schedule_lib.Schedule, remat: str
                    ) -> list[float]:
  """Per stage, the share of its micro-batches whose forward its backward
  recomputes under ``remat`` (0 for 'never')."""
  kept = memory_lib.KeptForwards(schedule, remat)
  m = schedule.num_micro_batches
  return [sum((s, j) not in kept for j in range(m)) / m
          for s in range(schedule.num_stages)]


def EngineSchedule(schedule: schedule_lib.Schedule) -> schedule_lib.Schedule:
  """The schedule as the engine runs it: a B directly followed by its W is
  one BW, the last stage's F and its backward one FB (engine.py's passes)."""
  return ticks_lib.FuseLast(ticks_lib.JoinBackward(schedule))


def ActionSeconds(schedule: schedule_lib.Schedule, remat: str,
                  pieces: Sequence[PieceCosts], comm: Comm = Comm()
                  ) -> Callable[[schedule_lib.Action], float]:
  """Pure: the seconds of each action of ``EngineSchedule(schedule)``.

  F, W: the stage's F and W; B, BW: the kept or the recomputing piece, as
  KeptForwards(schedule, remat) says; FB: F and the kept B (when a W
  follows) or BW. An action that receives a tensor from another device, or
  sends one there, also takes ``comm.cpu_seconds`` per message.
  """
  kept = memory_lib.KeptForwards(schedule, remat)
  program = EngineSchedule(schedule)
  messages = _Messages(program)

  def _Seconds(act: schedule_lib.Action) -> float:
    p = pieces[act.stage]
    if act.kind == F:
      t = p.forward
    elif act.kind == W:
      t = p.weight
    elif act.kind == FB:
      defers_w = program.DefersW(act.stage, act.micro_batch)
      t = p.forward + p.Backward(B if defers_w else BW, True)
    else:
      t = p.Backward(act.kind, (act.stage, act.micro_batch) in kept)
    return t + messages.get(act, 0) * comm.cpu_seconds

  return _Seconds


def _Messages(program: schedule_lib.Schedule) -> dict:
  """Per action, how many tensors it receives from or sends to another
  device (its data dependencies that ran on another device, both ways)."""
  device = {a: d for d, acts in enumerate(program.actions) for a in acts}
  count: dict = {}
  for acts in program.actions:
    for act in acts:
      for dep in program.Dependencies(act):
        if device[dep] != device[act]:
          count[act] = count.get(act, 0) + 1
          count[dep] = count.get(dep, 0) + 1
  return count


def Predict(schedule: schedule_lib.Schedule, remat: str,
            pieces: Sequence[PieceCosts], comm: Comm = Comm()) -> Prediction:
  """The step of ``schedule`` under ``remat`` with one PieceCosts per stage:
  EngineSchedule(schedule) replayed with ActionSeconds, ``comm.seconds``
  between devices.

  Raises:
    schedule.ScheduleError: the schedule is invalid.
  """
  program = EngineSchedule(schedule)
  program.Validate()
  replayed = replay_lib.Replay(program.actions, program.Dependencies,
                               ActionSeconds(schedule, remat, pieces, comm),
                               comm.seconds)
  busy = [sum(replayed.end[a] - replayed.start[a] for a in acts)
          for acts in program.actions]
  makespan = replayed.makespan
  return Prediction(makespan, 1.0 - sum(busy) / (len(busy) * makespan), busy)


def MeasuredBubble(busy_seconds: Sequence[float], step_seconds: float
                   ) -> float:
  """1 - each device's busy time over the step, averaged over devices; 0
  where the devices were busy longer than the step: busy time is a worker's
  CPU time, which counts each thread that ran its ops, so two ops at once
  count twice (seen at -0.03 on a loaded machine)."""
  return max(0.0, 1.0 - sum(busy_seconds) / (len(busy_seconds) *
                                             step_seconds))


def Summary(schedule: schedule_lib.Schedule, remat: str,
            pieces: Sequence[PieceCosts], comm: Comm,
            wall_pieces: Sequence[PieceCosts] | None = None) -> dict:
  """What a row keeps (seconds; lists per stage or device): every stage's
  piece costs, the recompute shares, comm, and the predicted step, bubble
  and busy time per device; with ``wall_pieces`` also the step predicted
  from the pieces' fastest wall times."""
  sim = Predict(schedule, remat, pieces, comm)
  out = dict(
      forward_seconds=[p.forward for p in pieces],
      backward_seconds=[p.backward for p in pieces],
      weight_seconds=[p.weight for p in pieces],
      backward_weight_seconds=[p.backward_weight for p in pieces],
      backward_remat_seconds=[p.Backward(B, False) for p in pieces],
      backward_weight_remat_seconds=[p.Backward(BW, False) for p in pieces],
      recompute_shares=RecomputeShares(schedule, remat),
      comm_seconds=comm.seconds, comm_cpu_seconds=comm.cpu_seconds,
      predicted_seconds=sim.makespan, simulated_bubble=sim.bubble_fraction,
      simulated_device_busy_seconds=sim.busy)
  if wall_pieces is not None:
    out['predicted_seconds_wall'] = Predict(schedule, remat, wall_pieces,
                                            comm).makespan
  return out


def ThreadCpuSeconds(pid: int) -> float:
  """The CPU time of process ``pid``'s live threads (their scheduler
  clocks, /proc/PID/task/*/schedstat, in ns): finer than /proc/PID/stat's
  10 ms ticks. A thread that exits takes its time with it, so read it
  over spans in which the process keeps its threads (one call)."""
  total = 0
  for path in glob.glob(f'/proc/{pid}/task/*/schedstat'):
    try:
      with open(path) as f:
        total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
      pass  # The thread ended meanwhile.
  return total / 1e9


def _Times(fn: Callable, cpu_seconds: Callable[[], float], calls: int
           ) -> tuple[float, float]:
  """(least CPU seconds, fastest wall seconds) of one call of ``fn``
  (already warmed up), over ``calls`` calls: a call's CPU time can only
  grow by what disturbs it (another process's turn on the core evicting its
  caches), never shrink below its work."""
  cpu, wall = [], []
  for _ in range(calls):
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn().numpy()
    wall.append(time.perf_counter() - t0)
    cpu.append(cpu_seconds() - c0)
  return min(cpu), min(wall)


def MeasureCosts(layers: Sequence, inputs: Sequence, device: str,
                 cpu_seconds: Callable[[], float], remat: bool = True,
                 calls: int = 7) -> tuple[PieceCosts, PieceCosts]:
  """Times the engine's pieces of a stage of ``layers`` (built, variables on
  ``device``) on ``inputs`` (one micro-batch, on ``device``).

  Args:
    layers: the stage's layers.
    inputs: its flat inputs.
    device: where it runs.
    cpu_seconds: the CPU time so far of whatever runs ``device`` (a local
      worker's ThreadCpuSeconds).
    remat: also time the recomputing B and BW.
    calls: calls of each piece (and of an empty call) timed.

  Returns:
    (costs from the CPU time, costs from the fastest wall time), each less
    an empty call's.
  """
  runs = PieceRuns(layers, inputs, device, remat)
  cpu, wall = {}, {}
  for name, fn in runs.items():
    fn().numpy()  # Trace and warm up.
    cpu[name], wall[name] = _Times(fn, cpu_seconds, calls)

  def _Costs(t):
    tiny = 1e-9  # Every piece takes some time.
    c = {k: max(v - t['empty'], tiny) for k, v in t.items()}
    return PieceCosts(c[F], c[B], c[W], c[BW], c.get('B_remat'),
                      c.get('BW_remat'))

  return _Costs(cpu), _Costs(wall)


def PieceRuns(layers: Sequence, inputs: Sequence, device: str,
              remat: bool = True, consume: bool = True) -> dict:
  """One tf.function per piece of the engine's program of a stage of
  ``layers`` on ``inputs``, fed with what the pieces before it make there:
  'empty' (a call that reads one value), F, B, W, BW, and with ``remat``
  'B_remat' and 'BW_remat'. Each returns one scalar on the chief; with
  ``consume`` the sum of every weight gradient (as the engine adds it into
  its gradient sums) and one value of every other output, else the piece's
  Tensors (to check what it computes; each weight's gradient unpacked).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import introspect  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import roles  # pylint: disable=g-import-not-at-top
  R = roles.Role

  program = introspect.TraceCell(
      layers, [tf.TensorSpec(x.shape, x.dtype) for x in inputs], device)
  with tf.device(device):
    seed = tf.constant([1, 2], tf.int64)
    x = roles.Tensors({R.SEED: (seed,), R.X: inputs})
    kept = program.Piece(ticks_lib.Step(F, 0, keep=True))(x)
    dy = tuple(None if y is None else tf.ones_like(y) for y in kept[R.Y])
    after_kept = x.With({R.SAVED: kept[R.SAVED], R.DY: dy})
    b = program.Piece(ticks_lib.Step(B, 0, keep=True))(after_kept)
    pieces = {F: (ticks_lib.Step(F, 0, keep=True), x),
              B: (ticks_lib.Step(B, 0, keep=True), after_kept),
              W: (ticks_lib.Step(W, 0), roles.Tensors({R.WCUT: b[R.WCUT]})),
              BW: (ticks_lib.Step(BW, 0, keep=True), after_kept)}
    if remat:
      pinned = program.Piece(ticks_lib.Step(F, 0))(x)[R.PINNED]
      after_remat = x.With({R.DY: dy, R.PINNED: pinned})
      pieces['B_remat'] = (ticks_lib.Step(B, 0), after_remat)
      pieces['BW_remat'] = (ticks_lib.Step(BW, 0), after_remat)

  def _Run(piece, feeds):
    @tf.function
    def _Call():
      with tf.device(device):
        out = piece(feeds)
        if not consume:  # Each weight's gradient, unpacked.
          return [t for role in piece.makes for t in (
              program.dws_flat.Unpack(out[role]) if role is R.DWS
              else out[role]) if t is not None]
        total = tf.constant(0.0)
        for role in piece.makes:
          for t in out.Present(role):
            if t.dtype.is_floating:
              part = t if role is R.DWS else tf.reshape(t, [-1])[:1]
              total += tf.cast(tf.reduce_sum(part), tf.float32)
        return total
    return _Call

  @tf.function
  def _Empty():
    with tf.device(device):
      return tf.reduce_sum(tf.reshape(inputs[0], [-1])[:1])

  runs = {'empty': _Empty}
  for name, (step, feeds) in pieces.items():
    runs[name] = _Run(program.Piece(step), feeds)
  return runs


def MeasureComm(tensor, devices: Sequence[str],
                cpu_seconds: Sequence[Callable[[], float]],
                reps: int = 8, calls: int = 5) -> Comm:
  """What one message of ``tensor`` (on devices[0]) costs between
  devices[0] and devices[1]: sent there and back ``reps`` times in one
  call, less a call that does the same work without messages; the fastest
  wall time per message, and the CPU time per message of each side
  (``cpu_seconds``: each device's clock), averaged."""
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

  def _Clock():
    return sum(c() for c in cpu_seconds)

  _PingPong().numpy()
  _Alone().numpy()
  ping_cpu, ping_wall = _Times(_PingPong, _Clock, calls)
  alone_cpu, alone_wall = _Times(_Alone, _Clock, calls)
  messages = 2 * reps
  # Each message costs its sender and its receiver CPU time (2 sides); the
  # rest of its wall time is a delay between them.
  side = max(ping_cpu - alone_cpu, 0.0) / (2 * messages)
  wall = max(ping_wall - alone_wall, 0.0) / messages
  return Comm(seconds=max(wall - 2 * side, 0.0), cpu_seconds=side)
