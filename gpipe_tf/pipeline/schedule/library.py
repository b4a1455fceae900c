"""The named pipeline schedules (gpipe, 1f1b, interleaved_1f1b, zb_h1) and their registry.

vshape.py registers two more, zbv and dualpipe_v, with their V-shaped
placement. Make(name, K, M, V) builds and validates one. Every builder lays out, per
device, the order of its passes; Schedule.Clocks() turns that into time. In
the pictures below (unit ticks: F, B, W one each, BW two) the cells read
'F3' = forward of micro-batch 3, 'F3s2' = the same at stage 2 when a device
holds several stages. Register() adds a schedule of one's own.
"""

from collections.abc import Callable
import dataclasses

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table

__all__ = ['Make', 'Names', 'Register']

Action = action_lib.Action
Schedule = table.Schedule
ScheduleError = action_lib.ScheduleError
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW

Builder = Callable[[int, int, int], Schedule]


@dataclasses.dataclass(frozen=True)
class _Entry:
  builder: Builder
  virtual_stages: bool


_REGISTRY: dict[str, _Entry] = {}


def Register(name: str, *, virtual_stages: bool = False) -> Callable[[Builder], Builder]:
  """Registers a schedule builder under a name (a decorator).

  Args:
    name: the name Make() takes.
    virtual_stages: whether the builder supports num_virtual_stages > 1
      (V stages per device, S = V * K); if not, Make() rejects V > 1 for it.

  Returns:
    A decorator over fn(num_devices, num_micro_batches, num_virtual_stages=1)
    -> Schedule that registers fn and returns it unchanged.

  Raises:
    ScheduleError: if the name is already registered.
  """
  def Decorate(builder: Builder) -> Builder:
    if name in _REGISTRY:
      raise ScheduleError(f'schedule {name!r} is already registered')
    _REGISTRY[name] = _Entry(builder, virtual_stages)
    return builder
  return Decorate


def Names() -> list[str]:
  """Returns the registered schedule names, sorted."""
  return sorted(_REGISTRY)


def Make(name: str, num_devices: int, num_micro_batches: int,
         num_virtual_stages: int = 1) -> Schedule:
  """Builds and validates a registered schedule.

  Args:
    name: one of Names().
    num_devices: K >= 1.
    num_micro_batches: M >= 1.
    num_virtual_stages: V >= 1 stages per device (S = V * K, stage s on device
      s % K, except 'zbv' and 'dualpipe_v', which need V = 2 and place stage
      s on device min(s, 2K-1-s)); V > 1 only for schedules registered with
      virtual_stages=True.

  Returns:
    The validated Schedule.

  Raises:
    ScheduleError: for an unknown name (the message lists the valid ones), a
      size that is not an int >= 1, V > 1 for a schedule without virtual
      stages (the message lists the ones with), or a size the builder refuses
      (e.g. 'zbv' with V != 2).
  """
  if name not in _REGISTRY:
    raise ScheduleError(f'unknown schedule {name!r}; registered: '
                        f'{", ".join(Names())}')
  action_lib.CheckIndex(num_devices, 'num_devices', minimum=1)
  action_lib.CheckIndex(num_micro_batches, 'num_micro_batches', minimum=1)
  action_lib.CheckIndex(num_virtual_stages, 'num_virtual_stages', minimum=1)
  entry = _REGISTRY[name]
  if num_virtual_stages > 1 and not entry.virtual_stages:
    able = [n for n in Names() if _REGISTRY[n].virtual_stages]
    raise ScheduleError(f'schedule {name!r} runs one stage per device; '
                        f'num_virtual_stages={num_virtual_stages} needs one of: '
                        f'{", ".join(able)}')
  schedule = entry.builder(num_devices, num_micro_batches, num_virtual_stages)
  schedule.Validate()
  return schedule


def _Alternate(forwards: list[Action], backwards: list[Action],
               warmup: int) -> list[Action]:
  """warmup forwards, then forward/backward pairs, then the remaining backwards."""
  steady = len(forwards) - warmup
  row = forwards[:warmup]
  for f, b in zip(forwards[warmup:], backwards[:steady]):
    row += [f, b]
  return row + backwards[steady:]


@Register('gpipe', virtual_stages=True)
def _GPipe(num_devices: int, num_micro_batches: int,
           num_virtual_stages: int = 1) -> Schedule:
  """Fill-drain (GPipe): every forward, then every backward in reverse order.

  Device d runs F(s, 0..M-1) for each of its stages s = d, d + K, ... in
  increasing stage order, then BW(s, M-1..0) for its stages in decreasing
  order. The reversed backward order is what a GradientTape over the whole step
  produces, and it lets the last micro-batch skip re-materialization (its
  activations are the freshest). Stage-major forwards never deadlock: stage s
  only waits for stage s-1, which its device finished first. K = 3, M = 4:

      dev 0: F0  F1  F2  F3  ..  ..  ..  ..  ..  ..  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0
      dev 1: ..  F0  F1  F2  F3  ..  ..  ..  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0 ..  ..
      dev 2: ..  ..  F0  F1  F2  F3  BW3 BW3 BW2 BW2 BW1 BW1 BW0 BW0 ..  ..  ..  ..

  Bubble (K - 1) / (M + K - 1); every device holds all M micro-batches.
  """
  num_k, num_m = num_devices, num_micro_batches
  rows = []
  for d in range(num_k):
    stages = [d + v * num_k for v in range(num_virtual_stages)]
    rows.append([Action(F, s, m) for s in stages for m in range(num_m)] +
                [Action(BW, s, m) for s in reversed(stages)
                 for m in reversed(range(num_m))])
  return Schedule(rows, num_m, name='gpipe')


def _OneFOneBRows(num_devices: int, num_micro_batches: int) -> list[list[Action]]:
  return [_Alternate([Action(F, d, m) for m in range(num_micro_batches)],
                     [Action(BW, d, m) for m in range(num_micro_batches)],
                     min(num_devices - d - 1, num_micro_batches))
          for d in range(num_devices)]


@Register('1f1b')
def _OneFOneB(num_devices: int, num_micro_batches: int,
              num_virtual_stages: int = 1) -> Schedule:
  """PipeDream-Flush, Megatron-LM's non-interleaved "1F1B" schedule.

  Device d runs w = min(K - d - 1, M) warm-up forwards, then pairs F(w + i),
  BW(i), then the last w backwards; micro-batches in increasing order. A
  backward frees its micro-batch as soon as the last stage is done with it, so
  device d holds at most min(K - d, M) micro-batches instead of M, for the
  same bubble as GPipe. K = 3, M = 4:

      dev 0: F0  F1  F2  ..  ..  ..  ..  BW0 BW0 F3  BW1 BW1 ..  BW2 BW2 ..  BW3 BW3
      dev 1: ..  F0  F1  ..  ..  BW0 BW0 F2  BW1 BW1 F3  BW2 BW2 ..  BW3 BW3 ..  ..
      dev 2: ..  ..  F0  BW0 BW0 F1  BW1 BW1 F2  BW2 BW2 F3  BW3 BW3 ..  ..  ..  ..
  """
  del num_virtual_stages  # Always 1 (Make checks).
  return Schedule(_OneFOneBRows(num_devices, num_micro_batches),
                  num_micro_batches, name='1f1b')


def _ChunkTable(num_micro_batches: int, num_chunks: int,
                group: int) -> list[tuple[int, int]]:
  """Megatron-LM's forward order of (micro_batch, chunk) pairs on every device.

  Micro-batches go in groups of `group`; a group runs chunk 0, then chunk 1, ...
  The last group takes whatever is left (fewer than `group` when M % group).
  """
  pairs = []
  for low in range(0, num_micro_batches, group):
    high = min(low + group, num_micro_batches)
    pairs += [(m, c) for c in range(num_chunks) for m in range(low, high)]
  return pairs


@Register('interleaved_1f1b', virtual_stages=True)
def _Interleaved(num_devices: int, num_micro_batches: int,
                 num_virtual_stages: int = 1) -> Schedule:
  """Megatron-LM's interleaved 1F1B: V stages ("chunks") per device.

  Stage s = c * K + d is chunk c of device d. Every device runs its M * V
  forwards in the order of _ChunkTable (groups of K micro-batches, chunk by
  chunk) and its backwards in the same order with chunks mirrored (chunk
  V-1-c). Device d first runs w = min(2 (K - d - 1) + (V - 1) K, M V) warm-up
  forwards, then forward/backward pairs, then the remaining backwards; this is
  Megatron's exact order, used whenever M is a multiple of K. The device
  orders for K = 2, M = 4, V = 2 (device 0 holds stages 0 and 2):

      dev 0 warm-up    F0s0 F1s0 F0s2 F1s2
            steady     F2s0 BW0s2 F3s0 BW1s2 F2s2 BW0s0 F3s2 BW1s0
            cool-down  BW2s2 BW3s2 BW2s0 BW3s0
      dev 1 warm-up    F0s1 F1s1
            steady     F0s3 BW0s3 F1s3 BW1s3 F2s1 BW0s1 F3s1 BW1s1 F2s3 BW2s3 F3s3 BW3s3
            cool-down  BW2s1 BW3s1

  For other M, Megatron's strict alternation can deadlock (e.g. K = 4, M = 5,
  V = 3), so the same two per-device orders are merged greedily instead: at
  each unit tick a free device runs its next forward if it is ready and the
  device holds fewer than w + 1 micro-batch-stages (Megatron's steady-state
  peak), else its next backward if ready, else idles. Where both apply, that
  merge equals Megatron's order in three cases of four and is never slower
  (K <= 8, M <= 24, V <= 4); it never deadlocks (see _ListSchedule).

  With equal pass times per stage and M a multiple of K, the bubble is
  Megatron's (K - 1) / (V M + K - 1), V times smaller than 1F1B's in idle time;
  for other M it is larger (the last, partial group of micro-batches leaves
  gaps) but in our sweep never slower than 1F1B. V = 1 is '1f1b'.
  """
  num_k, num_m, num_v = num_devices, num_micro_batches, num_virtual_stages
  if num_v == 1:
    return Schedule(_OneFOneBRows(num_k, num_m), num_m, name='interleaved_1f1b')
  pairs = _ChunkTable(num_m, num_v, num_k)
  forwards = [[Action(F, c * num_k + d, m) for m, c in pairs] for d in range(num_k)]
  backwards = [[Action(BW, (num_v - 1 - c) * num_k + d, m) for m, c in pairs]
               for d in range(num_k)]
  warmups = [min(2 * (num_k - d - 1) + (num_v - 1) * num_k, num_m * num_v)
             for d in range(num_k)]
  if num_m % num_k == 0:
    rows = [_Alternate(f, b, w) for f, b, w in zip(forwards, backwards, warmups)]
  else:
    probe = Schedule([f + b for f, b in zip(forwards, backwards)], num_m)
    rows = _ListSchedule(forwards, backwards, [w + 1 for w in warmups],
                         probe.Dependencies)
  return Schedule(rows, num_m, name='interleaved_1f1b')


def _ListSchedule(forwards: list[list[Action]], backwards: list[list[Action]],
                  caps: list[int],
                  dependencies: Callable[[Action], list[Action]]) -> list[list[Action]]:
  """Merges each device's forward and backward orders by unit-time list scheduling.

  At every tick each free device starts the first of (its next forward, if
  it holds fewer than caps[d] forwarded-but-not-backwarded passes; its next
  backward) whose dependencies have ended; F takes 1 tick, BW 2. If at some
  tick no device is busy and none can start, every cap grows by one: the
  earliest pending forward (or, once all forwards ran, backward) in the shared
  table order always has its inputs, so that suffices to move on.
  """
  num_k = len(forwards)
  rows = [[] for _ in range(num_k)]
  done_f, done_b, free = [0] * num_k, [0] * num_k, [0] * num_k
  end, tick, caps = {}, 0, list(caps)
  total = sum(len(f) + len(b) for f, b in zip(forwards, backwards))
  while len(end) < total:
    started = False
    for d in range(num_k):
      if free[d] > tick:
        continue
      candidates = []
      if done_f[d] < len(forwards[d]) and done_f[d] - done_b[d] < caps[d]:
        candidates.append(forwards[d][done_f[d]])
      if done_b[d] < len(backwards[d]):
        candidates.append(backwards[d][done_b[d]])
      for act in candidates:
        if all(end.get(dep, tick + 1) <= tick for dep in dependencies(act)):
          if act.kind == F:
            done_f[d] += 1
          else:
            done_b[d] += 1
          end[act] = free[d] = tick + table.UNIT_TICKS[act.kind]
          rows[d].append(act)
          started = True
          break
    if not started and all(f <= tick for f in free):
      caps = [c + 1 for c in caps]
    else:
      tick += 1
  return rows


@Register('zb_h1')
def _ZeroBubbleH1(num_devices: int, num_micro_batches: int,
                  num_virtual_stages: int = 1) -> Schedule:
  """ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024).

  The backward is split into B (input gradient, on the critical path) and W
  (weight gradient, which nothing waits for). Device d runs 1F1B's order with
  B in place of BW and min(K - d - 1, M) warm-up forwards, and puts W(i) after
  B(i + d): deferring W lets B race back down the pipeline, and the deferred W
  passes fill the cool-down bubble. With F = B = W the bubble shrinks from
  1F1B's 3 (K - 1) ticks per device to K - 1. K = 3, M = 4:

      dev 0: F0 F1 F2 .. .. B0 W0 F3 B1 W1 B2 W2 B3 W3
      dev 1: .. F0 F1 .. B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
      dev 2: .. .. F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3

  Activations of (s, m) live until W(s, m) ends, so every device holds
  min(K, M) micro-batches at its peak: the first device's 1F1B peak, which the
  paper keeps as the memory budget of every device (later devices hold more
  than under 1F1B, but no device holds more than 1F1B's busiest one).
  """
  del num_virtual_stages  # Always 1 (Make checks).
  num_k, num_m = num_devices, num_micro_batches
  rows = []
  for d in range(num_k):
    warmup = min(num_k - d - 1, num_m)
    row = [Action(F, d, m) for m in range(warmup)]
    weights = 0
    for m in range(num_m):
      if warmup + m < num_m:
        row.append(Action(F, d, warmup + m))
      row.append(Action(B, d, m))
      if m >= d:
        row.append(Action(W, d, weights))
        weights += 1
    rows.append(row + [Action(W, d, m) for m in range(weights, num_m)])
  return Schedule(rows, num_m, name='zb_h1')
