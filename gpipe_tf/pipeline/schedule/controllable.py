"""V-Half and V-Min: V-shaped schedules whose memory is set by one repeated building block.

The construction of Qi et al., "Pipeline Parallelism with Controllable
Memory" (2024): a schedule is one micro-batch's passes, timed (the building
block), repeated every T ticks. A device then holds, at any moment, about
lifespan / T micro-batches of each of its stages, where a stage's lifespan is
the time from its F to the end of its W; so the memory is set by how tightly
the block packs each stage's F, B and W, and the throughput by T. With the
V-shaped placement (vshape.VStageDevices: device d runs stages d and
2K-1-d) and F = B = W = 1 tick per stage, a device has 6 ticks of work per
micro-batch, so T = 6 leaves no bubble in the steady state.

BuildingBlock places the block's passes one by one in dependency order (the
Fs down and up the V, then the Bs back, then the Ws, or each W right after
its B), each at the first tick at or after its inputs are ready whose
residue mod T its device has not used yet: repeated every T ticks, no two
passes of a device then collide. Repeat lays the copies out and keeps each
device's order; the simulator and the engine run that order with the real
costs. Measured with the memory model on unit sizes (K = 2-16, M = 4K, the
W held from its B to its W costing nothing):

    VHalf   T = 6, Ws after every B:  0.50x 1F1B's peak at K = 2 and 4,
            0.38x at K = 8 and 16, at 0.93-0.94x 1F1B's simulated step
    VMin    T = 9:                    0.50x (K = 2), 0.38x (K = 4), 0.31x
            (K = 8), 0.28x (K = 16), at 1.33x 1F1B's step

The paper's hand-made blocks reach about 1/2 (V-Half) and 1/3 (V-Min) of
1F1B's activation memory; these blocks are placed greedily, not copied from
the paper's figures, and VMin pays for its memory with a 1.33x step (its
device idles 3 of every 9 ticks). K = 2, M = 4, VHalf (unit ticks):

    dev 0: F0s0 ..   ..   F0s3 B0s3 W0s3 F1s0 B0s0 W0s0 F1s3 B1s3 W1s3 F2s0 B1s0 W1s0 F2s3 B2s3 W2s3 F3s0 B2s0 W2s0 F3s3 B3s3 W3s3 ..   B3s0 W3s0
    dev 1: ..   F0s1 F0s2 ..   ..   B0s2 B0s1 F1s1 F1s2 W0s2 W0s1 B1s2 B1s1 F2s1 F2s2 W1s2 W1s1 B2s2 B2s1 F3s1 F3s2 W2s2 W2s1 B3s2 B3s1 W3s2 W3s1

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import vshape

__all__ = ['BuildingBlock', 'Families', 'Repeat', 'VHalf', 'VMin']

Action = action_lib.Action
Schedule = table.Schedule
ScheduleError = action_lib.ScheduleError
F, B, W = action_lib.F, action_lib.B, action_lib.W

# Ticks a V-shaped device works per micro-batch: F, B and W of two stages.
ZERO_BUBBLE_INTERVAL = 6
_V_MIN_INTERVAL = 9


def BuildingBlock(num_devices: int, interval: int = ZERO_BUBBLE_INTERVAL,
                  w_last: bool = True) -> dict[tuple[str, int], int]:
  """One micro-batch's passes on the V, timed in unit ticks (module docstring).

  Args:
    num_devices: K (2K stages).
    interval: T, the ticks between two micro-batches' blocks (>= 6).
    w_last: place every W after all the Bs (else each right after its B).

  Returns:
    {(kind, stage): start tick} for kind in F, B, W and every stage.

  Raises:
    ScheduleError: K < 1 or T < 6.
  """
  action_lib.CheckIndex(num_devices, 'num_devices', minimum=1)
  if (isinstance(interval, bool) or not isinstance(interval, int) or
      interval < ZERO_BUBBLE_INTERVAL):
    raise ScheduleError(
        f'interval must be an int >= {ZERO_BUBBLE_INTERVAL} (a V-shaped '
        f'device works {ZERO_BUBBLE_INTERVAL} ticks per micro-batch), got '
        f'{interval!r}')
  num_s = 2 * num_devices
  devices = vshape.VStageDevices(num_devices)
  used = [set() for _ in range(num_devices)]
  start = {}

  def _Place(kind, s, ready):
    tick = ready
    while tick % interval in used[devices[s]]:
      tick += 1  # At most T - 1 steps: the device has T residues, uses 6.
    used[devices[s]].add(tick % interval)
    start[kind, s] = tick

  for s in range(num_s):
    _Place(F, s, start[F, s - 1] + 1 if s else 0)
  for s in reversed(range(num_s)):
    _Place(B, s, start[B, s + 1] + 1 if s < num_s - 1 else start[F, s] + 1)
    if not w_last:
      _Place(W, s, start[B, s] + 1)
  if w_last:
    for s in reversed(range(num_s)):
      _Place(W, s, start[B, s] + 1)
  return start


def Repeat(block: dict[tuple[str, int], int], num_devices: int,
           num_micro_batches: int, interval: int, name: str) -> Schedule:
  """The block laid out every ``interval`` ticks for M micro-batches; each
  device's actions in the order of their ticks, on the V placement."""
  action_lib.CheckIndex(num_micro_batches, 'num_micro_batches', minimum=1)
  devices = vshape.VStageDevices(num_devices)
  rows = [[] for _ in range(num_devices)]
  for m in range(num_micro_batches):
    for (kind, s), tick in block.items():
      rows[devices[s]].append((tick + m * interval, Action(kind, s, m)))
  return Schedule([[a for _, a in sorted(row)] for row in rows],
                  num_micro_batches, devices, name=name)


def _CheckTwoStages(name: str, num_virtual_stages: int) -> None:
  if num_virtual_stages != 2:
    raise ScheduleError(
        f'{name} folds the pipeline into a V with 2 stages per device; set '
        f'num_virtual_stages=2, got {num_virtual_stages}')


def VHalf(num_devices: int, num_micro_batches: int,
          num_virtual_stages: int = 2) -> Schedule:
  """V-Half: the zero-bubble interval (T = 6), every W after the Bs.

  Raises:
    ScheduleError: V != 2, or K, M < 1.
  """
  _CheckTwoStages('v_half', num_virtual_stages)
  return Repeat(BuildingBlock(num_devices), num_devices, num_micro_batches,
                ZERO_BUBBLE_INTERVAL, 'v_half')


def VMin(num_devices: int, num_micro_batches: int,
         num_virtual_stages: int = 2) -> Schedule:
  """V-Min: T = 9, the least memory of these blocks at 1.5x V-Half's interval.

  Raises:
    ScheduleError: V != 2, or K, M < 1.
  """
  _CheckTwoStages('v_min', num_virtual_stages)
  return Repeat(BuildingBlock(num_devices, _V_MIN_INTERVAL), num_devices,
                num_micro_batches, _V_MIN_INTERVAL, 'v_min')


def Families(num_devices: int, num_micro_batches: int
             ) -> list[tuple[str, Schedule]]:
  """The building-block schedules the synthesizer starts from (V = 2):
  T = 6 to 9, Ws last or each after its B; VHalf and VMin among them."""
  out = []
  for interval in range(ZERO_BUBBLE_INTERVAL, _V_MIN_INTERVAL + 1):
    for w_last in (True, False):
      block = BuildingBlock(num_devices, interval, w_last)
      label = 'v_half' if (interval, w_last) == (ZERO_BUBBLE_INTERVAL, True) \
          else 'v_min' if (interval, w_last) == (_V_MIN_INTERVAL, True) \
          else f"v-block(T={interval}, W {'last' if w_last else 'after B'})"
      out.append((label, Repeat(block, num_devices, num_micro_batches,
                                interval, label)))
  return out
