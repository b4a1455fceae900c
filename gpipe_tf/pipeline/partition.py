"""Splits a stack of L layers into K contiguous pipeline cells with balanced cost.

A pipeline runs at the speed of its slowest cell, so the partitioner minimises the
largest cell cost exactly (dynamic programming over split points) instead of cutting a
cumulative cost histogram at k * total / K, which can leave a cell 25% over the optimum
(16 equal layers into 4 cells gives [3, 4, 4, 5]) or even empty (costs
[10, 1, 1, 1, 1, 1] into 4 cells). Among equally fast splits it prefers the one with the
lowest variance of cell costs, then the lexicographically largest list of layer counts,
so the answer is deterministic.

Everything here is pure Python; a balance is a list of layer counts per cell, e.g.
[3, 2] means cell 0 holds layers 0-2 and cell 1 holds layers 3-4.

This module deliberately does NOT measure costs (pass parameter counts, FLOPs or
profiled seconds) and does NOT place anything on devices.
"""

import math
import numbers
from collections.abc import Sequence
from typing import TypeVar

from gpipe_tf import errors

__all__ = ['CellCosts', 'CheckDevices', 'PartitionBalanced', 'PartitionError',
           'RecomputeWeights', 'SplitByBalance', 'ValidateBalance']

T = TypeVar('T')

# Comparisons of cell costs are made with this tolerance relative to the total cost
# (and its square for sums of squares), so splits whose costs differ only by
# floating-point rounding are treated as ties.
_RTOL = 1e-9

_CPU_HINT = ('on a CPU-only host split the CPU into more logical devices (the '
             "trainer's flag, or gpipe_tf.runtime.devices.SplitCpu) before TensorFlow starts")


class PartitionError(errors.Error, ValueError):
  """A partition or balance request that cannot be met; the message says what to change."""


def _CheckCount(value: int, name: str) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise PartitionError(f'{name} must be an int, got {value!r} '
                         f'({type(value).__name__})')


def _ValidatedCosts(costs: Sequence[float]) -> list[float]:
  """Returns costs as floats or raises PartitionError naming the first bad index."""
  result = []
  for i, c in enumerate(costs):
    ok = (not isinstance(c, bool) and isinstance(c, numbers.Real) and
          math.isfinite(c) and c >= 0)
    if not ok:
      raise PartitionError(
          f'costs[{i}] = {c!r} is not a non-negative finite number; every layer '
          f'cost must be >= 0 and finite (zero is allowed)')
    result.append(float(c))
  return result


def _PrefixSums(costs: Sequence[float]) -> list[float]:
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  return prefix


def PartitionBalanced(costs: Sequence[float], num_partitions: int,
                      weights: Sequence[float] | None = None) -> list[int]:
  """Splits layers with the given costs into contiguous cells minimising the slowest cell.

  The objective, in order:
    1. the maximum cell cost (the pipeline's clock period) is minimal;
    2. among those splits, the variance of cell costs is minimal (equivalently the sum
       of squared cell costs, since the total and the number of cells are fixed);
    3. among those, the lexicographically largest list of layer counts is returned.
  Costs are compared with a tolerance of 1e-9 times the total cost, so splits that
  differ only by floating-point rounding count as ties.

  The search is exact: a dynamic program over split points, O(K * L * log L) for the
  optimal maximum and at most O(K * L^2) (usually far less) for the tie-break.

  Example: 16 equal costs into 4 cells give [4, 4, 4, 4];
  [10, 1, 1, 1, 1, 1] into 4 cells gives [1, 2, 2, 1] (cell costs 10, 2, 2, 1).

  Args:
    costs: L non-negative finite per-layer costs, in layer order.
    num_partitions: K, the number of cells; 1 <= K <= L.
    weights: optional K positive factors, one per cell: cell c costs
      weights[c] times the sum of its layers' costs (a cell that also
      recomputes its forward in the backward does more work per layer than
      one that does not). None: all 1.

  Returns:
    A list of K positive layer counts summing to L.

  Raises:
    PartitionError: if a cost is negative, infinite, NaN or not a number (the message
      names its index), if num_partitions < 1, or if there are fewer layers than cells
      (the message says how many cells would fit).
  """
  _CheckCount(num_partitions, 'num_partitions')
  values = _ValidatedCosts(costs)
  num_layers, k_cells = len(values), num_partitions
  if k_cells < 1:
    raise PartitionError(
        f'num_partitions must be >= 1, got {k_cells}; use num_partitions=1 to run '
        f'the model without a pipeline')
  if num_layers == 0:
    raise PartitionError('cannot split 0 layers into cells; the model needs at '
                         'least one layer')
  if num_layers < k_cells:
    raise PartitionError(
        f'cannot split {num_layers} layers into {k_cells} cells; '
        f'use num_partitions <= {num_layers}')

  if weights is None:
    weights = [1.0] * k_cells
  weights = [float(w) for w in weights]
  if len(weights) != k_cells or not all(
      math.isfinite(w) and w > 0 for w in weights):
    raise PartitionError(
        f'weights must be {k_cells} positive finite numbers, one per cell; '
        f'got {list(weights)}')
  prefix = _PrefixSums(values)
  total = prefix[-1] * max(weights)
  eps = _RTOL * total
  eps_sq = _RTOL * total * total
  inf = math.inf

  def seg(i: int, e: int, c: int = 1) -> float:
    """Cost of layers i..e-1 as the first of the last c cells."""
    return (prefix[e] - prefix[i]) * weights[k_cells - c]

  # Phase 1: best[c][i] = smallest possible maximum cell cost when layers i..L-1 are
  # split into c non-empty cells. It is non-increasing in i, while the first cell's
  # cost seg(i, e) is non-decreasing in e, so the optimum over e sits where the two
  # cross and is found by bisection.
  if len(set(weights)) > 1:
    # With unequal weights best[c][i] is no longer monotone in i (a cell's
    # weight depends on its position), so bisect on the answer instead. A
    # cap is feasible when the last layer can be reached cell by cell: from
    # each reachable start, a cell reaches an interval of ends, whose upper
    # end never moves back as the start moves on (costs are >= 0).
    def feasible(cap_value: float) -> bool:
      reach = [False] * (num_layers + 1)
      reach[0] = True
      for c in range(k_cells, 0, -1):
        marks = [0] * (num_layers + 2)
        end = 0
        for i in range(num_layers):
          if not reach[i] or seg(i, i + 1, c) > cap_value:
            continue
          end = max(end, i + 1)
          while end < num_layers and seg(i, end + 1, c) <= cap_value:
            end += 1
          marks[i + 1] += 1
          marks[end + 1] -= 1
        running, reach = 0, [False] * (num_layers + 1)
        for e in range(num_layers + 1):
          running += marks[e]
          reach[e] = running > 0
      return reach[num_layers]

    lo, hi = 0.0, seg(0, num_layers, 1) * max(weights) / weights[-1]
    for _ in range(200):
      mid = (lo + hi) / 2
      if feasible(mid):
        hi = mid
      else:
        lo = mid
      if hi - lo <= eps * 1e-3:
        break
    return _TieBreak(k_cells, num_layers, prefix, seg, hi + eps, eps_sq)
  best = [[inf] * (num_layers + 1) for _ in range(k_cells + 1)]
  for i in range(num_layers):
    best[1][i] = seg(i, num_layers, 1)
  for c in range(2, k_cells + 1):
    rest = best[c - 1]
    for i in range(num_layers - c + 1):
      lo, hi = i + 1, num_layers - c + 1  # Candidate ends e of the first cell.
      while lo < hi:  # First e with seg(i, e) >= rest[e], or hi if none.
        mid = (lo + hi) // 2
        if seg(i, mid, c) >= rest[mid]:
          hi = mid
        else:
          lo = mid + 1
      candidates = [max(seg(i, e, c), rest[e]) for e in (lo - 1, lo)
                    if i + 1 <= e <= num_layers - c + 1]
      best[c][i] = min(candidates)
  return _TieBreak(k_cells, num_layers, prefix, seg,
                   best[k_cells][0] + eps, eps_sq)


def _TieBreak(k_cells: int, num_layers: int, prefix: list[float], seg,
              cap: float, eps_sq: float) -> list[int]:
  """Phases 2 and 3 of PartitionBalanced under the optimal maximum `cap`."""
  inf = math.inf

  # Phase 2: squares[c][i] = smallest sum of squared cell costs when layers i..L-1 are
  # split into c non-empty cells, each costing at most cap.
  squares = [[inf] * (num_layers + 1) for _ in range(k_cells + 1)]
  squares[0][num_layers] = 0.0
  for c in range(1, k_cells + 1):
    rest = squares[c - 1]
    # Feasible remainders form a suffix: start at the first one.
    first = next(e for e in range(num_layers + 1) if rest[e] < inf)
    for i in range(num_layers - c + 1):
      value = inf
      for e in range(max(i + 1, first), num_layers - c + 2):
        s = seg(i, e, c)
        if s > cap:
          break
        if rest[e] < inf:
          value = min(value, s * s + rest[e])
      squares[c][i] = value

  # Phase 3: walk forward, giving each cell as many layers as keeps the remainder
  # optimal; this yields the lexicographically largest optimal balance.
  balance = []
  i = 0
  for c in range(k_cells, 0, -1):
    for e in range(num_layers - c + 1, i, -1):
      s = seg(i, e, c)
      rest = squares[c - 1][e]
      if s <= cap and rest < inf and s * s + rest <= squares[c][i] + eps_sq:
        break
    else:  # Unreachable: phase 2 proved that an optimal split exists.
      raise AssertionError('internal error: no optimal split found')
    balance.append(e - i)
    i = e
  return balance


def RecomputeWeights(shares: Sequence[float]) -> list[float] | None:
  """PartitionBalanced weights for cells that recompute different shares.

  With the backward costing about twice the forward, a cell that recomputes
  its forward for a share r of its micro-batches does (3 + r) / 3 the work
  per layer of one that recomputes none. None when all shares are equal
  (the plain split is then the same).
  """
  weights = [(3.0 + r) / 3.0 for r in shares]
  return None if len(set(weights)) <= 1 else weights


def CheckDevices(num_partitions: int, num_devices: int) -> None:
  """Checks that every cell can get its own device.

  Args:
    num_partitions: K, the number of pipeline cells.
    num_devices: how many devices are available to the pipeline.

  Raises:
    PartitionError: if there are more cells than devices; the message says how many
      devices exist and how to get more logical devices on a CPU host.
  """
  _CheckCount(num_partitions, 'num_partitions')
  _CheckCount(num_devices, 'num_devices')
  if num_partitions > num_devices:
    raise PartitionError(
        f'the pipeline has {num_partitions} cells but only {num_devices} '
        f'device(s) exist; use num_partitions <= {num_devices}, or {_CPU_HINT}')


def ValidateBalance(balance: Sequence[int], num_layers: int,
                     num_devices: int | None = None) -> list[int]:
  """Checks an explicit, user-given balance.

  Args:
    balance: layer counts per cell, e.g. [3, 2].
    num_layers: how many layers the model has.
    num_devices: if given, how many devices are available; the balance may not have
      more cells than that.

  Returns:
    The balance as a new list of ints.

  Raises:
    PartitionError: if the balance is empty, holds a count that is not an int >= 1,
      has more cells than devices, or does not sum to num_layers. The message suggests
      a balance that would fit (the balanced equal-count split).
  """
  _CheckCount(num_layers, 'num_layers')
  balance = list(balance)
  if not balance:
    raise PartitionError('balance is empty; give at least one cell, e.g. '
                         f'balance=[{num_layers}]')
  for i, count in enumerate(balance):
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
      raise PartitionError(
          f'balance[{i}] = {count!r} but every cell needs an int number of layers '
          f'>= 1; balance {balance} is invalid')
  if num_devices is not None:
    CheckDevices(len(balance), num_devices)
  total = sum(balance)
  if total != num_layers:
    cells = min(len(balance), num_layers)
    hint = (f'e.g. use balance={PartitionBalanced([1.0] * num_layers, cells)}'
            if num_layers >= 1 else 'the model needs at least one layer')
    raise PartitionError(f'balance {balance} sums to {total} but the model has '
                         f'{num_layers} layers; {hint}')
  return [int(count) for count in balance]


def SplitByBalance(items: Sequence[T], balance: Sequence[int]) -> list[list[T]]:
  """Splits items (layers, layer Params, costs, ...) into consecutive groups.

  Args:
    items: the L items, in layer order.
    balance: layer counts per cell, summing to L.

  Returns:
    One list per cell, e.g. SplitByBalance('abcde', [3, 2]) gives
    [['a', 'b', 'c'], ['d', 'e']].

  Raises:
    PartitionError: if the balance is invalid for len(items) layers.
  """
  balance = ValidateBalance(balance, len(items))
  groups, start = [], 0
  for count in balance:
    groups.append(list(items[start:start + count]))
    start += count
  return groups


def CellCosts(costs: Sequence[float], balance: Sequence[int]) -> list[float]:
  """Sums per-layer costs into per-cell costs.

  Args:
    costs: L non-negative finite per-layer costs.
    balance: layer counts per cell, summing to L.

  Returns:
    The total cost of each cell, e.g. CellCosts([10, 1, 1, 1, 1, 1], [1, 2, 2, 1])
    gives [10.0, 2.0, 2.0, 1.0].

  Raises:
    PartitionError: if a cost is invalid or the balance does not fit len(costs).
  """
  values = _ValidatedCosts(costs)
  return [math.fsum(group) for group in SplitByBalance(values, balance)]
