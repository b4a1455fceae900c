"""Layout: the balance, the stages per device and the schedule chosen together, on the simulated step.

A balance that evens out every stage's cost is not the fastest when the
schedule is not even itself: the first stage also pays for the embedding,
the last for the loss, a 1F1B pipeline's first device holds K micro-batches
and its last one, and a V-shaped placement puts the first and the last
stage on one device. Choose() therefore tries, for each V (1, and 2 when
there are layers enough):

    balances    PartitionBalanced on every layer's F + B + W (the first and
                the last stage's extras added to their layer), then the same
                with the first and/or the last stage weighed 1.5x, which
                moves layers off them
    schedule    synthesize.Synthesize for each balance: the stage costs and
                bytes are sums over the stage's layers

and keeps the shortest simulated step that fits the memory budget; ties go
to the layout tried first. Layouts are tried in the order of a lower bound
of their step (their busiest device's work), and one whose bound is no
shorter than the best step found is skipped. A stage's bytes are its layers' sums
and what its later layers add joined to the layer before (LayerCost.joined) but
its input, which is its first layer's input (memory.StageBytes).

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline.schedule import library
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import synthesize
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import vshape

__all__ = ['Choice', 'Choose', 'LayerCost', 'OneFOneBPeak', 'StageBytesOf',
           'StageProblem']

MemoryBudgetError = synthesize.MemoryBudgetError


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """One layer's durations per micro-batch and sizes (a one-layer stage's).

  Attributes:
    forward, backward, weight: the durations of its F, B and W.
    bytes: its memory.StageBytes, `input` being its own input.
    joined: what its stage holds beyond `bytes` and the layer before's when
      it runs after that layer in one stage (layer_bytes.JoinedBytes: the
      inputs its backward reads that the layer before does not keep).
  """
  forward: float
  backward: float
  weight: float
  bytes: memory.StageBytes = memory.StageBytes()
  joined: memory.StageBytes = memory.StageBytes()


_NOTHING = LayerCost(0.0, 0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Choice:
  """What Choose() picked.

  Attributes:
    balance: layers per stage (K x V stages).
    num_virtual_stages: V.
    problem: the stage costs it was synthesized for.
    synthesized: synthesize.Synthesize's answer for that balance.
    considered: (V, balance, simulated step, or None when nothing fit or
      the layout's busiest device alone needs longer than the best step
      found) of every candidate, in the order tried (most promising first).
  """
  balance: tuple[int, ...]
  num_virtual_stages: int
  problem: synthesize.Problem
  synthesized: synthesize.Synthesized
  considered: tuple[tuple[int, tuple[int, ...], float | None], ...]

  @property
  def schedule(self) -> table.Schedule:
    """The schedule to run."""
    return self.synthesized.schedule

  @property
  def makespan(self) -> float:
    """Its simulated step."""
    return self.synthesized.best.makespan

  @property
  def peaks(self) -> tuple[float, ...]:
    """Per device, its modelled peak bytes (weights included)."""
    return self.synthesized.best.peaks


def StageBytesOf(layers: Sequence[memory.StageBytes],
                 joined: Sequence[memory.StageBytes] = ()
                 ) -> memory.StageBytes:
  """A stage's bytes from its layers': the first one's input, the rest
  summed, with `joined`, its later layers' LayerCost.joined."""
  every = list(layers) + list(joined)
  return memory.StageBytes(
      input=layers[0].input,
      **{f: sum(getattr(x, f) for x in every)
         for f in ('activations', 'wcut', 'pinned', 'weights', 'gradients')})


def _Balances(costs: list[float], num_stages: int) -> list[tuple[int, ...]]:
  """The plain balance, then with the first and/or last stage weighed 1.5x."""
  out = []
  heavy = 1.5
  for first, last in ((1.0, 1.0), (heavy, 1.0), (1.0, heavy), (heavy, heavy)):
    weights = [1.0] * num_stages
    weights[0] *= first
    weights[-1] *= last
    balance = tuple(partition.PartitionBalanced(
        costs, num_stages, None if num_stages == 1 or (first, last) == (
            1.0, 1.0) else weights))
    if balance not in out:
      out.append(balance)
  return out


def _Costs(layers: Sequence[LayerCost], first_extra: LayerCost,
           last_extra: LayerCost) -> list[float]:
  """F + B + W of every layer, the extras on the first and the last."""
  costs = [x.forward + x.backward + x.weight for x in layers]
  costs[0] += first_extra.forward + first_extra.backward + first_extra.weight
  costs[-1] += last_extra.forward + last_extra.backward + last_extra.weight
  return costs


def StageProblem(layers: Sequence[LayerCost], balance: Sequence[int],
                 num_devices: int, num_micro_batches: int,
                 first_extra: LayerCost | None = None,
                 last_extra: LayerCost | None = None, comm_time: float = 0.0,
                 remat: str = 'never') -> synthesize.Problem:
  """The synthesize.Problem of a balance: its stages' summed costs and bytes.

  V = len(balance) / K.

  Raises:
    partition.PartitionError: a balance that does not fit the layers.
    ScheduleError: a balance not a multiple of K long, bad costs.
  """
  if len(balance) % num_devices:
    raise synthesize.ScheduleError(
        f'balance {list(balance)} has {len(balance)} stages, not a multiple '
        f'of K = {num_devices}')
  stages = partition.SplitByBalance(list(layers), balance)
  stages[0] = stages[0] + [first_extra or _NOTHING]
  stages[-1] = stages[-1] + [last_extra or _NOTHING]
  return synthesize.Problem.Make(
      num_devices, num_micro_batches,
      [sum(x.forward for x in st) for st in stages],
      [sum(x.backward for x in st) for st in stages],
      [sum(x.weight for x in st) for st in stages],
      [StageBytesOf([x.bytes for x in st], [x.joined for x in st[1:]])
       for st in stages],
      num_virtual_stages=len(balance) // num_devices, comm_time=comm_time,
      remat=remat)


def OneFOneBPeak(layers: Sequence[LayerCost], num_devices: int,
                 num_micro_batches: int, first_extra: LayerCost | None = None,
                 last_extra: LayerCost | None = None,
                 remat: str = 'never') -> float:
  """1F1B's modelled peak bytes on its fullest device, on the plain balance.

  The reference budget: what the one-stage-per-device schedule every
  library has holds.
  """
  balance = partition.PartitionBalanced(
      _Costs(layers, first_extra or _NOTHING, last_extra or _NOTHING),
      num_devices)
  problem = StageProblem(layers, balance, num_devices, num_micro_batches,
                         first_extra, last_extra, remat=remat)
  return max(synthesize.Evaluate(problem, library.Make(
      '1f1b', num_devices, num_micro_batches)).peaks)


def _LowerBound(problem: synthesize.Problem) -> float:
  """No schedule's step is shorter than its busiest device's work; the
  least of that over the placements Synthesize tries."""
  work = [f + b + w for f, b, w in zip(problem.forward, problem.backward,
                                       problem.weight)]
  k = problem.num_devices
  placements = [[s % k for s in range(problem.num_stages)]]
  if problem.num_virtual_stages == 2:
    placements.append(vshape.VStageDevices(k))
  return problem.num_micro_batches * min(
      max(sum(x for x, d in zip(work, placed) if d == dev)
          for dev in range(k)) for placed in placements)


def Choose(layers: Sequence[LayerCost], num_devices: int,
           num_micro_batches: int,
           memory_budget: float | Sequence[float] | None = None,
           virtual_stages: Sequence[int] = (1, 2),
           first_extra: LayerCost | None = None,
           last_extra: LayerCost | None = None, comm_time: float = 0.0,
           remat: str = 'never', search: bool = True) -> Choice:
  """Picks the balance, V and schedule with the shortest simulated step that fits.

  Args:
    layers: every layer's LayerCost, in order (at least K of them).
    num_devices: K.
    num_micro_batches: M.
    memory_budget: bytes per device (one number, or one per device) in the
      units of the layers' bytes; None: no limit.
    virtual_stages: the V to try; a V is skipped when there are fewer than
      K x V layers.
    first_extra: what the first stage does beside its layers (an embedding
      outside the layer list), on the stage holding the first layer.
    last_extra: the same for the last stage (the loss and its gradient).
    comm_time: transfer time between devices (synthesize.Problem).
    remat: the remat policy (memory.REMATS).
    search: run the greedy search too (synthesize.Synthesize).

  Returns:
    The Choice.

  Raises:
    MemoryBudgetError: nothing fits; the message gives the smallest budget
      found for any V and balance.
    partition.PartitionError: fewer layers than K.
    ScheduleError: bad sizes, costs or budget.
  """
  first_extra, last_extra = first_extra or _NOTHING, last_extra or _NOTHING
  costs = _Costs(layers, first_extra, last_extra)
  vs = [v for v in virtual_stages if num_devices * v <= len(layers)] or [1]
  best, considered, refused = None, [], []
  candidates = []
  for v in vs:
    for balance in _Balances(costs, num_devices * v):
      problem = StageProblem(layers, balance, num_devices, num_micro_batches,
                             first_extra, last_extra, comm_time, remat)
      candidates.append((_LowerBound(problem), len(candidates), v, balance,
                         problem))
  # Most promising first; a layout whose busiest device's work alone takes
  # longer than the best step found cannot win and is not synthesized.
  for bound, _, v, balance, problem in sorted(candidates):
    if best is not None and bound >= best.synthesized.best.makespan:
      considered.append((v, balance, None))
      continue
    try:
      found = synthesize.Synthesize(problem, memory_budget, search)
    except MemoryBudgetError as e:
      refused.append(e)
      considered.append((v, balance, None))
      continue
    considered.append((v, balance, found.best.makespan))
    step = float(f'{found.best.makespan:.9g}')
    if best is None or step < float(f'{best.synthesized.best.makespan:.9g}'):
      best = Choice(balance, v, problem, found, ())
  if best is None:
    least = min(refused, key=lambda e: e.smallest)
    raise MemoryBudgetError(
        f'no balance, V in {vs} or schedule of K={num_devices}, '
        f'M={num_micro_batches} fits the memory budget; the leanest needs '
        f'{least.smallest:.6g} on its fullest device (raise the budget to '
        f'at least that, or use remat, more devices or smaller '
        f'micro-batches). For its V and balance: {least}', least.smallest)
  return dataclasses.replace(best, considered=tuple(considered))
