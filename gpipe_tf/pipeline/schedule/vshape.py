"""The V-shaped schedules (zbv, dualpipe_v): two stages per device, folded back down the devices.

With K devices and S = 2K stages, device d runs stage d on the way down and
stage 2K-1-d on the way back, so the pipeline folds into a V and the first
and last stages share device 0. K = 3:

    stage     0  1  2  3  4  5
    device    0  1  2  2  1  0        device 0: stages 0, 5
                                      device 1: stages 1, 4
                                      device 2: stages 2, 3

The fold puts both ends of the pipeline on one device: the loss of a
micro-batch is computed on device 0, whose backward of stage 5 can start at
once, and stage K-1 hands its activations to stage K on the same device.
Both builders register with library.Register and take
num_virtual_stages = 2 only. Their pictures are Schedule.ToAscii(), unit
ticks (F, B, W one each, BW two); 'F3s5' = forward of micro-batch 3, stage 5.
"""

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import table

__all__ = ['V_SHAPED', 'VStageDevices']

Action = action_lib.Action
Schedule = table.Schedule
ScheduleError = action_lib.ScheduleError
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW

# The schedules this module registers; each runs with num_virtual_stages = 2
# only.
V_SHAPED = ('zbv', 'dualpipe_v')


def VStageDevices(num_devices: int) -> list[int]:
  """Returns the V-shaped placement: stage_devices[s] for S = 2K stages.

  Stage s < K is on device s, stage s >= K on device 2K-1-s; e.g. K = 3 gives
  [0, 1, 2, 2, 1, 0].
  """
  return list(range(num_devices)) + list(reversed(range(num_devices)))


def _CheckTwoStages(name: str, num_virtual_stages: int) -> None:
  if num_virtual_stages != 2:
    raise ScheduleError(
        f'schedule {name!r} folds the pipeline into a V with 2 stages per '
        f'device (stage d and stage 2K-1-d on device d); set '
        f'num_virtual_stages=2, got {num_virtual_stages}')


class _Row:
  """One device's action list, numbering each stage's micro-batches in order.

  F, W and the backward (B or BW, whichever runs) of a stage each take the
  micro-batches 0, 1, 2, ... in turn. Backward() may leave a split backward's
  W queued for OldestWeight() to place later.
  """

  def __init__(self):
    self.actions = []
    self._next = {}
    self._pending = []  # W of split backwards, oldest first (Backward).

  def Add(self, kind: str, stage: int) -> Action:
    """Appends kind(stage, m) for the kind's next micro-batch m on that stage."""
    key = (BW if kind == B else kind, stage)
    m = self._next.get(key, 0)
    self._next[key] = m + 1
    act = Action(kind, stage, m)
    self.actions.append(act)
    return act

  def Count(self, kind: str, stage: int) -> int:
    """How many of kind (B and BW together) the row holds for a stage."""
    return self._next.get((BW if kind == B else kind, stage), 0)

  def Backward(self, stage: int, split: bool) -> None:
    """Appends BW(stage, next m), or B(stage, next m) and queues its W."""
    act = self.Add(B if split else BW, stage)
    if split:
      self._pending.append(Action(W, stage, act.micro_batch))

  def OldestWeight(self) -> None:
    """Appends the W of the oldest B whose W is still queued, if any."""
    if self._pending:
      self.actions.append(self._pending.pop(0))


@library.Register('zbv', virtual_stages=True)
def _ZeroBubbleV(num_devices: int, num_micro_batches: int,
                 num_virtual_stages: int = 2) -> Schedule:
  """ZB-V of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), section 6.

  V-shaped placement (see the module docstring), backward split into B and W.
  Device d holds stage d ("down", chunk 0) and stage 2K-1-d ("up", chunk 1).
  Its list, for n = max(M, 2K - 1) micro-batches, keeping only those < M:

      warm-up    2(K-d)-1 F down; d x (F up, F down); K-d x (F up, B up, W up)
      steady     until both chunks forwarded n:
                 (F down if any left), B down, W down, F up, B up, W up
      cool-down  d x (B down, B up); K-d x (B down, W down of the oldest);
                 the remaining W up, then the remaining W down

  The same order as PyTorch's ScheduleZBVZeroBubble. With F = B = W (each a
  pass over half a device's layers) and M >= 2K - 1, every device idles
  K - 1 ticks in all, half of ZB-H1's idle time: bubble (K-1) / (6M + K-1).
  Device d holds 2K stage-micro-batches at its peak, K micro-batches' worth of
  its layers: 1F1B's first device, the paper's memory budget. K = 2, M = 3:

      dev 0: F0s0 F1s0 F2s0 F0s3 B0s3 W0s3 F1s3 B1s3 W1s3 B0s0 W0s0 F2s3 B2s3 W2s3 B1s0 W1s0 B2s0 W2s0 ..
      dev 1: ..   F0s1 F0s2 F1s1 F1s2 B0s2 W0s2 F2s1 B0s1 W0s1 F2s2 B1s2 W1s2 B1s1 B2s2 B2s1 W1s1 W2s2 W2s1

  Any K >= 1 and M >= 1 (for M < 2K - 1 the pipeline never fills).

  Raises:
    ScheduleError: unless num_virtual_stages == 2.
  """
  _CheckTwoStages('zbv', num_virtual_stages)
  num_k, num_m = num_devices, num_micro_batches
  total = max(num_m, 2 * num_k - 1)
  rows = []
  for d in range(num_k):
    down, up = d, 2 * num_k - 1 - d
    row = _Row()
    for _ in range(2 * (num_k - d) - 1):
      row.Add(F, down)
    for _ in range(d):
      row.Add(F, up)
      row.Add(F, down)
    for _ in range(num_k - d):
      row.Add(F, up)
      row.Add(B, up)
      row.Add(W, up)
    while row.Count(F, up) < row.Count(F, down) or row.Count(F, down) < total:
      if row.Count(F, down) < total:
        row.Add(F, down)
      row.Add(B, down)
      row.Add(W, down)
      row.Add(F, up)
      row.Add(B, up)
      row.Add(W, up)
    for _ in range(d):
      row.Add(B, down)
      row.Add(B, up)
    for _ in range(num_k - d):
      row.Add(B, down)
      row.Add(W, down)
    while row.Count(W, up) < row.Count(B, up):
      row.Add(W, up)
    while row.Count(W, down) < row.Count(B, down):
      row.Add(W, down)
    rows.append([a for a in row.actions if a.micro_batch < num_m])
  return Schedule(rows, num_m, VStageDevices(num_k), name='zbv')


@library.Register('dualpipe_v', virtual_stages=True)
def _DualPipeV(num_devices: int, num_micro_batches: int,
               num_virtual_stages: int = 2) -> Schedule:
  """DualPipeV: DeepSeek's DualPipe (DeepSeek-V3 report, 2024) cut in half.

  DualPipe feeds micro-batches into both ends of the pipeline at once, so it
  keeps two copies of every stage's weights; DualPipeV feeds one end and folds
  the stages into a V (see the module docstring): one copy, still two stages
  per device.
  Its steady state pairs a forward of one stage with a whole backward (BW) of
  the other, back to back: on a GPU the two overlap, one's communication
  hiding behind the other's compute (PyTorch's OVERLAP_F_B); here they are
  two consecutive actions. Device d, stage "down" = d, "up" = 2K-1-d:

      1  2(K-d-1) F down
      2  d+1 x (F down, F up)
      3  K-d-1 x (B up, W up, F up)
      4  M-2K+d+1 x (F down, BW up; F up, BW down)
      5  K-d-1 x (BW up; F up, BW down)
      6  d+1 x (backward up, backward down): BW for the first half, then B
      7  K-d-1 x (the oldest pending W, B down)
      8  the d+1 pending W

  where a W always goes to the oldest B without one. The same order as
  PyTorch's ScheduleDualPipeV. With unit times its bubble equals ZB-V's,
  (K-1) / (6M + K-1): what it gains on a GPU, hiding communication behind
  the paired passes, is not modelled here. Peak: 2K + 1 stage-micro-batches
  per device. K = 2, M = 4:

      dev 0: F0s0  F1s0  F2s0  F0s3  B0s3  W0s3  F1s3  F3s0  BW1s3 BW1s3 F2s3  BW0s0 BW0s0 BW2s3 BW2s3 F3s3  ..    BW1s0 BW1s0 BW3s3 BW3s3 B2s0  W2s0  B3s0  W3s0
      dev 1: ..    F0s1  F0s2  F1s1  F1s2  F2s1  BW0s2 BW0s2 F2s2  BW0s1 BW0s1 F3s1  BW1s2 BW1s2 F3s2  BW1s1 BW1s1 BW2s2 BW2s2 BW2s1 BW2s1 B3s2  B3s1  W3s2  W3s1

  Raises:
    ScheduleError: unless num_virtual_stages == 2 and M >= 2K (every device
      must reach the steady state; PyTorch has the same bound).
  """
  _CheckTwoStages('dualpipe_v', num_virtual_stages)
  num_k, num_m = num_devices, num_micro_batches
  if num_m < 2 * num_k:
    raise ScheduleError(
        f"schedule 'dualpipe_v' needs num_micro_batches >= 2 * num_devices = "
        f'{2 * num_k} (one per stage) to fill its V; got {num_m}: raise M or '
        "use 'zbv'")
  rows = []
  for d in range(num_k):
    down, up = d, 2 * num_k - 1 - d
    row = _Row()
    for _ in range(2 * (num_k - d - 1)):
      row.Add(F, down)
    for _ in range(d + 1):
      row.Add(F, down)
      row.Add(F, up)
    for _ in range(num_k - d - 1):
      row.Backward(up, split=True)
      row.OldestWeight()
      row.Add(F, up)
    for _ in range(num_m - 2 * num_k + d + 1):
      row.Add(F, down)
      row.Backward(up, split=False)
      row.Add(F, up)
      row.Backward(down, split=False)
    for _ in range(num_k - d - 1):
      row.Backward(up, split=False)
      row.Add(F, up)
      row.Backward(down, split=False)
    # Step 6: the first half of the last d + 1 pairs run whole backwards, the
    # rest split ones, whose W then fill the drain. Odd devices switch one
    # pass earlier (before the up stage's backward), even ones after it.
    half = (d + 1) // 2
    for i in range(d + 1):
      split = i > half or (i == half and d % 2 == 1)
      row.Backward(up, split)
      row.Backward(down, split=i >= half)
    for _ in range(num_k - d - 1):
      row.OldestWeight()
      row.Backward(down, split=True)
    for _ in range(d + 1):
      row.OldestWeight()
    rows.append(row.actions)
  return Schedule(rows, num_m, VStageDevices(num_k), name='dualpipe_v')
