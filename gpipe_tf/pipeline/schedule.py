"""Decides in which order and at which clock tick each pipeline cell runs each micro-batch.

A schedule is a pure-Python table that a graph builder follows: it lists, for every cell
k and micro-batch m, a forward task F(k, m) and a backward task B(k, m), the order in
which each cell runs its tasks, and which tasks must finish before another may start.
Two schedules are provided:

  * GPipeSchedule: fill-drain, as in the GPipe paper. All forwards, then all
    backwards; every cell holds the activations of all M micro-batches at its peak.
  * OneFOneBSchedule: PipeDream-Flush / Megatron "1F1B" (non-interleaved). Same
    bubble, but cell k holds at most min(K - k, M) micro-batches in flight.

simulate() replays any schedule with given forward and backward durations and reports
start and end times, the makespan and the idle (bubble) fraction.

This module deliberately does NOT build TensorFlow ops, place devices or decide what is
recomputed; it only answers "what runs when, after what".
"""

import dataclasses
import numbers
from collections.abc import Sequence

FORWARD = 'F'
BACKWARD = 'B'


@dataclasses.dataclass(frozen=True, order=True)
class Task:
  """One unit of pipeline work: a forward or backward pass of one cell on one micro-batch.

  Attributes:
    kind: 'F' for the forward pass, 'B' for the backward pass.
    cell: k, the 0-based index of the pipeline cell (stage).
    micro_batch: m, the 0-based index of the micro-batch.
  """
  kind: str
  cell: int
  micro_batch: int

  def __post_init__(self):
    if self.kind not in (FORWARD, BACKWARD):
      raise ValueError(f"Task kind must be 'F' or 'B', got {self.kind!r}")

  @property
  def label(self) -> str:
    """Short label used in ASCII tables, e.g. 'F2' (the cell is implied by the row)."""
    return f'{self.kind}{self.micro_batch}'

  def __str__(self) -> str:
    return f'{self.kind}(cell={self.cell}, micro_batch={self.micro_batch})'


def _check_positive_int(value: int, name: str) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f'{name} must be an int >= 1, got {value!r}')


class Schedule:
  """Base class: per-cell task orders, dependencies, the clock table and its picture.

  Subclasses define order_for_cell(); everything else follows from it. The clock table
  (clocks()) is the list schedule of unit-time tasks: at each tick every cell runs the
  next task in its own order if all of that task's dependencies finished at earlier
  ticks.

  Attributes:
    num_cells: K, the number of pipeline cells.
    num_micro_batches: M, the number of micro-batches per step.
  """

  def __init__(self, num_cells: int, num_micro_batches: int):
    """Creates a schedule for K cells and M micro-batches.

    Args:
      num_cells: K >= 1.
      num_micro_batches: M >= 1.

    Raises:
      ValueError: if K or M is not an int >= 1.
    """
    _check_positive_int(num_cells, 'num_cells')
    _check_positive_int(num_micro_batches, 'num_micro_batches')
    self.num_cells = num_cells
    self.num_micro_batches = num_micro_batches

  def __repr__(self) -> str:
    return (f'{type(self).__name__}(num_cells={self.num_cells}, '
            f'num_micro_batches={self.num_micro_batches})')

  def _check_cell(self, cell: int) -> None:
    if not 0 <= cell < self.num_cells:
      raise ValueError(f'cell must be in [0, {self.num_cells}), got {cell}')

  def _check_task(self, task: Task) -> None:
    self._check_cell(task.cell)
    if not 0 <= task.micro_batch < self.num_micro_batches:
      raise ValueError(f'micro_batch must be in [0, {self.num_micro_batches}), '
                       f'got {task.micro_batch} in {task}')

  def order_for_cell(self, cell: int) -> list[Task]:
    """Returns the order in which the given cell runs its 2 * M tasks.

    Args:
      cell: k in [0, K).

    Returns:
      The cell's tasks, first to last.

    Raises:
      ValueError: if the cell is out of range.
    """
    raise NotImplementedError

  def dependencies(self, task: Task) -> list[Task]:
    """Returns the tasks that must finish before the given task starts.

    These are the task's predecessor in its cell's order (if any) plus its data
    dependencies: F(k, m) needs F(k-1, m); B(k, m) needs F(k, m) and, unless k is the
    last cell, B(k+1, m).

    Args:
      task: a task of this schedule.

    Returns:
      The distinct dependencies, the same-cell predecessor first.

    Raises:
      ValueError: if the task's cell or micro-batch is out of range.
    """
    self._check_task(task)
    k, m = task.cell, task.micro_batch
    order = self.order_for_cell(k)
    position = order.index(task)
    deps = [order[position - 1]] if position > 0 else []
    if task.kind == FORWARD:
      data = [Task(FORWARD, k - 1, m)] if k > 0 else []
    else:
      data = [Task(FORWARD, k, m)]
      if k < self.num_cells - 1:
        data.append(Task(BACKWARD, k + 1, m))
    deps.extend(d for d in data if d not in deps)
    return deps

  def clocks(self) -> list[list[Task]]:
    """Returns the clock table: the tasks that run at each unit-time tick.

    Returns:
      One list per tick, holding at most one task per cell, sorted by cell.
    """
    timeline = simulate(self, forward_time=1, backward_time=1)
    table = [[] for _ in range(int(timeline.makespan))]
    for task, start in timeline.start.items():
      table[int(start)].append(task)
    return [sorted(tick, key=lambda t: t.cell) for tick in table]

  def bubble_fraction(self) -> float:
    """Returns the idle fraction of the K x T clock grid with unit-time tasks.

    For GPipe this is (K - 1) / (M + K - 1).
    """
    busy = 2 * self.num_cells * self.num_micro_batches
    return 1.0 - busy / (self.num_cells * len(self.clocks()))

  def max_in_flight(self, cell: int) -> int:
    """Returns the peak number of micro-batches whose activations the cell holds.

    A micro-batch is in flight on cell k from the start of F(k, m) until B(k, m) ends;
    this is what bounds the cell's activation memory.

    Args:
      cell: k in [0, K).

    Raises:
      ValueError: if the cell is out of range.
    """
    self._check_cell(cell)
    live = peak = 0
    for task in self.order_for_cell(cell):
      live += 1 if task.kind == FORWARD else -1
      peak = max(peak, live)
    return peak

  def to_ascii(self) -> str:
    """Draws the clock table, one row per cell and one column per tick.

    Idle ticks are drawn as '..' (padded to the column width). The result for a
    GPipeSchedule(3, 4) is shown in that class's docstring.

    Returns:
      K lines 'cell k: ...' joined by newlines, with no trailing newline.
    """
    table = self.clocks()
    width = max(2, len(f'F{self.num_micro_batches - 1}'))
    rows = []
    for k in range(self.num_cells):
      cells = ['.' * 2] * len(table)
      for t, tick in enumerate(table):
        for task in tick:
          if task.cell == k:
            cells[t] = task.label
      rows.append(f'cell {k}: ' + ' '.join(c.ljust(width) for c in cells).rstrip())
    return '\n'.join(rows)


class GPipeSchedule(Schedule):
  """Fill-drain schedule of the GPipe paper.

  Cell k runs F(k, 0..M-1) and then B(k, M-1..0). Forward tick t runs F(k, t - k) on
  every cell k with 0 <= t - k < M, so the forward phase takes M + K - 1 ticks; the
  backward phase is its mirror image, the last cell starting first with the last
  micro-batch. For K = 3 cells and M = 4 micro-batches (time flows to the right):

      cell 0: F0 F1 F2 F3 .. .. .. .. B3 B2 B1 B0
      cell 1: .. F0 F1 F2 F3 .. .. B3 B2 B1 B0 ..
      cell 2: .. .. F0 F1 F2 F3 B3 B2 B1 B0 .. ..

  Each cell is idle for 2 * (K - 1) of the 2 * (M + K - 1) ticks, a bubble fraction of
  (K - 1) / (M + K - 1); it shrinks as M grows. Every cell holds all M micro-batches
  at its peak (re-materialization is what keeps that affordable).
  """

  def order_for_cell(self, cell: int) -> list[Task]:
    self._check_cell(cell)
    m_range = range(self.num_micro_batches)
    return ([Task(FORWARD, cell, m) for m in m_range] +
            [Task(BACKWARD, cell, m) for m in reversed(m_range)])

  def clocks(self) -> list[list[Task]]:
    num_k, num_m = self.num_cells, self.num_micro_batches
    phase = num_m + num_k - 1
    forward = [[Task(FORWARD, k, t - k) for k in range(num_k) if 0 <= t - k < num_m]
               for t in range(phase)]
    backward = [[Task(BACKWARD, k, num_m - 1 - (t - (num_k - 1 - k)))
                 for k in range(num_k) if 0 <= t - (num_k - 1 - k) < num_m]
                for t in range(phase)]
    return forward + backward


class OneFOneBSchedule(Schedule):
  """PipeDream-Flush ("1F1B", Megatron-LM, non-interleaved) schedule.

  Cell k first runs w = min(K - k - 1, M) warm-up forwards, then alternates one
  forward and one backward for the remaining M - w forwards, then runs the remaining
  w backwards. Backwards start as soon as the last cell has finished a micro-batch, so
  cell k holds at most min(K - k, M) micro-batches in flight instead of M; with unit
  forward and backward times the bubble equals GPipe's. For K = 3 and M = 4:

      cell 0: F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3
      cell 1: .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..
      cell 2: .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..

  Cell 0 holds F0, F1 and F2 (three = K - 0 micro-batches) before B0 frees one.
  """

  def order_for_cell(self, cell: int) -> list[Task]:
    self._check_cell(cell)
    num_m = self.num_micro_batches
    warmup = min(self.num_cells - cell - 1, num_m)
    order = [Task(FORWARD, cell, m) for m in range(warmup)]
    for i in range(num_m - warmup):
      order += [Task(FORWARD, cell, warmup + i), Task(BACKWARD, cell, i)]
    order += [Task(BACKWARD, cell, m) for m in range(num_m - warmup, num_m)]
    return order


@dataclasses.dataclass(frozen=True)
class Timeline:
  """When every task of a simulated schedule starts and ends.

  Attributes:
    start: start time of every task.
    end: end time of every task.
    makespan: end time of the last task (the first task starts at 0).
    bubble_fraction: idle share of the K x makespan cell-time area.
  """
  start: dict[Task, float]
  end: dict[Task, float]
  makespan: float
  bubble_fraction: float


def _per_cell(value: float | Sequence[float], num_cells: int, name: str) -> list[float]:
  values = [value] * num_cells if isinstance(value, (int, float)) else list(value)
  if len(values) != num_cells or any(v <= 0 for v in values):
    raise ValueError(f'{name} must be a positive number or {num_cells} positive '
                     f'numbers (one per cell), got {value!r}')
  return [float(v) for v in values]


def simulate(schedule: Schedule, forward_time: float | Sequence[float] = 1.0,
             backward_time: float | Sequence[float] = 2.0) -> Timeline:
  """Replays a schedule: each task starts once its dependencies have all ended.

  Each cell runs its tasks in order_for_cell() order, one at a time, and a task starts
  at the latest end time of its dependencies (as early as possible).

  Args:
    schedule: the schedule to replay.
    forward_time: duration of a forward task, or one duration per cell.
    backward_time: duration of a backward task, or one duration per cell.

  Returns:
    The Timeline of start and end times, makespan and bubble fraction.

  Raises:
    ValueError: if a duration is not positive or a per-cell list has the wrong length.
    RuntimeError: if the schedule's orders deadlock (a dependency cycle).
  """
  num_k = schedule.num_cells
  durations = {FORWARD: _per_cell(forward_time, num_k, 'forward_time'),
               BACKWARD: _per_cell(backward_time, num_k, 'backward_time')}
  orders = [schedule.order_for_cell(k) for k in range(num_k)]
  deps = {task: schedule.dependencies(task) for order in orders for task in order}
  start, end = {}, {}
  position = [0] * num_k
  remaining = len(deps)
  while remaining:
    progressed = False
    for k, order in enumerate(orders):
      while position[k] < len(order):
        task = order[position[k]]
        if any(d not in end for d in deps[task]):
          break
        start[task] = max((end[d] for d in deps[task]), default=0.0)
        end[task] = start[task] + durations[task.kind][k]
        position[k] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      stuck = [str(order[position[k]]) for k, order in enumerate(orders)
               if position[k] < len(order)]
      raise RuntimeError(f'{schedule!r} deadlocks; waiting tasks: {", ".join(stuck)}')
  makespan = max(end.values())
  busy = sum(end[t] - start[t] for t in end)
  return Timeline(start=start, end=end, makespan=makespan,
                  bubble_fraction=1.0 - busy / (num_k * makespan))


_SCHEDULES = {'gpipe': GPipeSchedule, '1f1b': OneFOneBSchedule}


def make_schedule(name: str, num_cells: int, num_micro_batches: int) -> Schedule:
  """Creates a schedule by name.

  Args:
    name: 'gpipe' (fill-drain) or '1f1b' (PipeDream-Flush).
    num_cells: K >= 1.
    num_micro_batches: M >= 1.

  Returns:
    The Schedule.

  Raises:
    ValueError: if the name is unknown (the message lists valid names) or K or M is
      not an int >= 1.
  """
  if name not in _SCHEDULES:
    raise ValueError(f'unknown schedule {name!r}; valid names: '
                     f'{", ".join(sorted(_SCHEDULES))}')
  return _SCHEDULES[name](num_cells, num_micro_batches)
