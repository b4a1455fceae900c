"""Folds a tick program's repeating stretches into loops: the plan by which the interpreter builds a step.

A tick program (ticks.py) of a pipeline schedule repeats itself: once every
device is busy, the same steps come back every few ticks, only on later
micro-batches. 1F1B with K = 2, M = 8 (the last stage fused)::

    dev 0: F0  F1  BW0 | F2  BW1 | F3  BW2 | ... | F7  BW6 | BW7
    dev 1: ..  FB0 FB1 | ..  FB2 | ..  FB3 | ... | ..  FB7 | ..
           static        repeat: 2 ticks, 6 times          static

What a tick builds is its *column*: the branch each device runs and, per
stage, whether a neighbour's output or gradient arrives. Which micro-batch
a step works on is not part of it (the interpreter reads that from the
program's tables by tick). So a stretch in which a run of columns repeats
can be built once and run as a ``tf.while_loop``, its ticks laid out as
straight-line code in the loop's body: no per-tick ``tf.switch_case`` picks
the steps, and the graph holds the stretch's period, whatever M is.

``Fold`` cuts a program into segments:

* ``STATIC``: ticks built one by one (warm-up, cool-down);
* ``REPEAT``: `period` ticks built once, run `repeats` times in a loop;
* ``SWITCH``: one loop iteration per tick, each device's steps picked by a
  ``tf.switch_case``: a program whose folded ticks still exceed `budget`
  runs so, its graph holding each device's steps once.

What each tick adds to the graph is its *cost* (the interpreter counts the
ops of the steps it runs). A program whose ticks cost at most `budget` is
built whole, as one STATIC segment (the unrolled execution builds every
program so). A longer one has its repeats folded, greedily from the first
tick; if what the graph then holds still costs more than `budget`, the
whole program runs as one SWITCH loop. Every registered schedule's steady
state repeats, so what its step builds stops growing with M once M is a few
times K.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

__all__ = ['DEFAULT_BUDGET', 'EXECUTIONS', 'MAX_PERIOD', 'REPEAT', 'STATIC',
           'SWITCH', 'Columns', 'Fold', 'Plan', 'Segment']

STATIC, REPEAT, SWITCH = 'static', 'repeat', 'switch'
MAX_PERIOD = 64  # The longest period looked for, in ticks.
EXECUTIONS = ('loop', 'unrolled', 'folded', 'switch')  # Plan's.


class Segment(NamedTuple):
  """Ticks start .. start + period * repeats - 1, built as `kind` says.

  Attributes:
    kind: STATIC, REPEAT or SWITCH.
    start: its first tick.
    period: the ticks one iteration runs (STATIC: all of them, SWITCH: 1).
    repeats: the iterations (STATIC: 1).
  """
  kind: str
  start: int
  period: int
  repeats: int

  @property
  def end(self) -> int:
    """The tick after its last."""
    return self.start + self.period * self.repeats


# The ops of steps a 'loop' step's graph may hold by default
# (PipeliningLayer's loop_budget); how it was chosen, and what it trades, is
# in benchmarks/trace_cost.
DEFAULT_BUDGET = 24_000


def Columns(program: Any) -> list[tuple]:
  """What each tick of a ticks.TickProgram builds: per device its branch,
  per stage whether an output and a gradient arrive, per skip whether it
  or its gradient arrives."""
  return [tuple(row[t] for row in program.branch) +
          tuple(row[t] >= 0 for row in program.got_y) +
          tuple(row[t] >= 0 for row in program.got_dx) +
          tuple(row[t] >= 0 for row in getattr(program, 'got_skip', ())) +
          tuple(row[t] >= 0 for row in getattr(program, 'got_dskip', ()))
          for t in range(program.num_ticks)]


def _BestRepeat(columns: Sequence[tuple], costs: Sequence[int], i: int,
                max_period: int) -> tuple[int, int, int]:
  """(period, repeats, the period's cost) of the run of repeats starting at
  tick i that saves the most cost (its period's cost times repeats - 1);
  the shorter period on a tie; (1, 1, costs[i]) when none repeats."""
  n = len(columns)
  best, saved, cost = (1, 1, costs[i]), 0, 0
  for p in range(1, min(max_period, (n - i) // 2) + 1):
    cost += costs[i + p - 1]
    first = columns[i:i + p]
    r = 1
    while i + (r + 1) * p <= n and columns[i + r * p:i + (r + 1) * p] == first:
      r += 1
    if r > 1 and cost * (r - 1) > saved:
      best, saved = (p, r, cost), cost * (r - 1)
  return best


def _FoldRepeats(columns: Sequence[tuple], costs: Sequence[int],
                 budget: float) -> tuple[list[Segment], int]:
  """(segments, what they cost to build): the repeats folded greedily from
  the first tick, stopping once the cost passes `budget`."""
  n = len(columns)
  segments: list[Segment] = []
  built, i = 0, 0
  while i < n and built <= budget:
    p, r, cost = _BestRepeat(columns, costs, i, MAX_PERIOD)
    if r > 1:
      segments.append(Segment(REPEAT, i, p, r))
    elif segments and segments[-1].kind == STATIC:
      segments[-1] = segments[-1]._replace(period=segments[-1].period + 1)
    else:
      segments.append(Segment(STATIC, i, 1, 1))
    built += cost
    i += p * r
  return segments, built


def Fold(columns: Sequence[tuple], budget: float,
         costs: Sequence[int] | None = None) -> tuple[Segment, ...]:
  """Cuts ticks with these Columns into segments (module docstring).

  Args:
    columns: Columns(program).
    budget: the most the graph may hold, in the unit of `costs`
      (DEFAULT_BUDGET ops); 0 runs every program as one SWITCH loop.
    costs: what building each tick adds to the graph (default: 1 a tick).

  Returns:
    Segments in tick order, covering every tick once.
  """
  n = len(columns)
  costs = [1] * n if costs is None else list(costs)
  if n == 0:
    return ()
  if sum(costs) <= budget:
    return (Segment(STATIC, 0, n, 1),)
  segments, built = _FoldRepeats(columns, costs, budget)
  if built > budget:
    return (Segment(SWITCH, 0, 1, n),)
  return tuple(segments)


def Plan(columns: Sequence[tuple], execution: str, budget: float,
         costs: Sequence[int] | None = None) -> tuple[Segment, ...]:
  """The segments a step builds a tick program as, by `execution`.

  Args:
    columns: Columns(program).
    execution: 'loop' (Fold by `budget`: whole, folded or one switch loop,
      whichever fits first), 'unrolled' (whole, whatever M: the reference
      the others are tested against), 'folded' (repeats folded, whatever
      the budget) or 'switch' (one switch loop).
    budget: the ops a 'loop' step may hold.
    costs: what building each tick adds to the graph (default: 1 a tick).

  Raises:
    ValueError: an unknown execution.
  """
  n = len(columns)
  if execution not in EXECUTIONS:
    raise ValueError(f'execution must be one of {EXECUTIONS}, got '
                     f'{execution!r}')
  if n == 0:
    return ()
  if execution == 'loop':
    return Fold(columns, budget, costs)
  if execution == 'unrolled':
    return (Segment(STATIC, 0, n, 1),)
  if execution == 'switch':
    return (Segment(SWITCH, 0, 1, n),)
  costs = [1] * n if costs is None else list(costs)
  return tuple(_FoldRepeats(columns, costs, float('inf'))[0])
