"""Tests for gpipe_tf.pipeline.schedule: clock tables, dependencies, bubbles, memory bounds."""

import pathlib
import sys
import unittest

# Lets `python tests/schedule_test.py` import the package without installing it.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from gpipe_tf.pipeline import schedule  # pylint: disable=wrong-import-position
from gpipe_tf.pipeline.schedule import Task  # pylint: disable=wrong-import-position

_SCHEDULE_CLASSES = (schedule.GPipeSchedule, schedule.OneFOneBSchedule)
_GRID = [(k, m) for k in range(1, 6) for m in range(1, 7)]


def F(cell, micro_batch):  # pylint: disable=invalid-name
  return Task('F', cell, micro_batch)


def B(cell, micro_batch):  # pylint: disable=invalid-name
  return Task('B', cell, micro_batch)


def _tick_of(table):
  return {task: t for t, tick in enumerate(table) for task in tick}


def _table_as_text(table):
  """Each tick as 'F/B cell micro_batch' strings, e.g. ['F00', 'F11']."""
  return [[f'{t.kind}{t.cell}{t.micro_batch}' for t in tick] for tick in table]


class GPipeScheduleTest(unittest.TestCase):

  def test_clock_table_for_3_cells_4_micro_batches(self):
    table = schedule.GPipeSchedule(3, 4).clocks()
    self.assertEqual(_table_as_text(table), [
        ['F00'],
        ['F01', 'F10'],
        ['F02', 'F11', 'F20'],
        ['F03', 'F12', 'F21'],
        ['F13', 'F22'],
        ['F23'],
        ['B23'],
        ['B13', 'B22'],
        ['B03', 'B12', 'B21'],
        ['B02', 'B11', 'B20'],
        ['B01', 'B10'],
        ['B00'],
    ])

  def test_order_for_cell(self):
    self.assertEqual(schedule.GPipeSchedule(3, 3).order_for_cell(1),
                     [F(1, 0), F(1, 1), F(1, 2), B(1, 2), B(1, 1), B(1, 0)])

  def test_clocks_equal_unit_time_simulation(self):
    for k, m in _GRID:
      gpipe = schedule.GPipeSchedule(k, m)
      self.assertEqual(gpipe.clocks(), schedule.Schedule.clocks(gpipe),
                       msg=f'K={k} M={m}')

  def test_bubble_fraction(self):
    for k, m in _GRID:
      gpipe = schedule.GPipeSchedule(k, m)
      expected = (k - 1) / (m + k - 1)
      self.assertAlmostEqual(gpipe.bubble_fraction(), expected, msg=f'K={k} M={m}')
      self.assertAlmostEqual(schedule.simulate(gpipe, 1, 1).bubble_fraction, expected)
      self.assertEqual(len(gpipe.clocks()), 2 * (m + k - 1))

  def test_every_cell_holds_all_micro_batches(self):
    gpipe = schedule.GPipeSchedule(4, 6)
    self.assertEqual([gpipe.max_in_flight(k) for k in range(4)], [6] * 4)

  def test_ascii(self):
    self.assertEqual(schedule.GPipeSchedule(3, 4).to_ascii(), '\n'.join([
        'cell 0: F0 F1 F2 F3 .. .. .. .. B3 B2 B1 B0',
        'cell 1: .. F0 F1 F2 F3 .. .. B3 B2 B1 B0 ..',
        'cell 2: .. .. F0 F1 F2 F3 B3 B2 B1 B0 .. ..',
    ]))

  def test_ascii_pads_wide_labels(self):
    rows = schedule.GPipeSchedule(2, 11).to_ascii().splitlines()
    self.assertEqual(len(rows), 2)
    self.assertTrue(rows[0].startswith('cell 0: F0  F1  F2 '))
    self.assertTrue(rows[1].startswith('cell 1: ..  F0  F1 '))
    self.assertIn('F10 ..  ', rows[0])


class OneFOneBScheduleTest(unittest.TestCase):

  def test_order_for_cells(self):
    one_f_one_b = schedule.OneFOneBSchedule(3, 4)
    self.assertEqual(one_f_one_b.order_for_cell(0), [
        F(0, 0), F(0, 1), F(0, 2), B(0, 0), F(0, 3), B(0, 1), B(0, 2), B(0, 3)])
    self.assertEqual(one_f_one_b.order_for_cell(2), [
        F(2, 0), B(2, 0), F(2, 1), B(2, 1), F(2, 2), B(2, 2), F(2, 3), B(2, 3)])

  def test_fewer_micro_batches_than_warmup(self):
    # M = 2 < K - 1 = 3: cell 0 warms up with both forwards and never alternates.
    self.assertEqual(schedule.OneFOneBSchedule(4, 2).order_for_cell(0),
                     [F(0, 0), F(0, 1), B(0, 0), B(0, 1)])

  def test_in_flight_bound(self):
    for k, m in _GRID:
      one_f_one_b = schedule.OneFOneBSchedule(k, m)
      for cell in range(k):
        self.assertEqual(one_f_one_b.max_in_flight(cell), min(k - cell, m),
                         msg=f'K={k} M={m} cell={cell}')

  def test_in_flight_bound_holds_in_clock_table(self):
    # Independent of max_in_flight(): count live micro-batches tick by tick.
    for k, m in _GRID:
      table = schedule.OneFOneBSchedule(k, m).clocks()
      for cell in range(k):
        live = peak = 0
        for tick in table:
          for task in tick:
            if task.cell == cell:
              live += 1 if task.kind == 'F' else -1
              peak = max(peak, live)
        self.assertEqual(peak, min(k - cell, m), msg=f'K={k} M={m} cell={cell}')

  def test_same_bubble_as_gpipe_with_unit_times(self):
    for k, m in _GRID:
      self.assertAlmostEqual(schedule.OneFOneBSchedule(k, m).bubble_fraction(),
                             (k - 1) / (m + k - 1), msg=f'K={k} M={m}')

  def test_ascii(self):
    self.assertEqual(schedule.OneFOneBSchedule(3, 4).to_ascii(), '\n'.join([
        'cell 0: F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3',
        'cell 1: .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..',
        'cell 2: .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..',
    ]))


class ScheduleInvariantsTest(unittest.TestCase):
  """Properties every schedule must have, over a grid of K and M."""

  def test_docstring_pictures_match_to_ascii(self):
    for cls in _SCHEDULE_CLASSES:
      for row in cls(3, 4).to_ascii().splitlines():
        self.assertIn(row, cls.__doc__, msg=cls.__name__)

  def test_each_task_once(self):
    for cls in _SCHEDULE_CLASSES:
      for k, m in _GRID:
        sched = cls(k, m)
        expected = sorted(Task(kind, c, b) for kind in 'FB' for c in range(k)
                          for b in range(m))
        in_table = sorted(t for tick in sched.clocks() for t in tick)
        in_orders = sorted(t for c in range(k) for t in sched.order_for_cell(c))
        self.assertEqual(in_table, expected, msg=f'{sched!r}')
        self.assertEqual(in_orders, expected, msg=f'{sched!r}')
        for c in range(k):
          self.assertTrue(all(t.cell == c for t in sched.order_for_cell(c)))

  def test_at_most_one_task_per_cell_per_tick(self):
    for cls in _SCHEDULE_CLASSES:
      for k, m in _GRID:
        for tick in cls(k, m).clocks():
          cells = [t.cell for t in tick]
          self.assertEqual(len(cells), len(set(cells)))

  def test_clock_table_follows_cell_order_and_dependencies(self):
    for cls in _SCHEDULE_CLASSES:
      for k, m in _GRID:
        sched = cls(k, m)
        tick_of = _tick_of(sched.clocks())
        for cell in range(k):
          ticks = [tick_of[t] for t in sched.order_for_cell(cell)]
          self.assertEqual(ticks, sorted(ticks), msg=f'{sched!r} cell {cell}')
        for task in tick_of:
          for dep in sched.dependencies(task):
            self.assertLess(tick_of[dep], tick_of[task], msg=f'{sched!r} {task}')

  def test_data_dependencies(self):
    for cls in _SCHEDULE_CLASSES:
      for k, m in _GRID:
        sched = cls(k, m)
        for task in _tick_of(sched.clocks()):
          deps = sched.dependencies(task)
          c, b = task.cell, task.micro_batch
          if task.kind == 'F' and c > 0:
            self.assertIn(F(c - 1, b), deps)
          if task.kind == 'B':
            self.assertIn(F(c, b), deps)
            if c < k - 1:
              self.assertIn(B(c + 1, b), deps)
          self.assertEqual(len(deps), len(set(deps)))

  def test_dependencies_spelled_out(self):
    gpipe = schedule.GPipeSchedule(3, 4)
    self.assertEqual(gpipe.dependencies(F(0, 0)), [])
    self.assertEqual(gpipe.dependencies(F(1, 2)), [F(1, 1), F(0, 2)])
    self.assertEqual(gpipe.dependencies(B(2, 3)), [F(2, 3)])
    self.assertEqual(gpipe.dependencies(B(0, 1)), [B(0, 2), F(0, 1), B(1, 1)])

  def test_dependencies_rejects_foreign_task(self):
    with self.assertRaisesRegex(ValueError, 'micro_batch'):
      schedule.GPipeSchedule(2, 2).dependencies(F(0, 2))
    with self.assertRaisesRegex(ValueError, 'cell'):
      schedule.GPipeSchedule(2, 2).dependencies(B(2, 0))


class SimulateTest(unittest.TestCase):

  def test_start_after_dependencies_end(self):
    for cls in _SCHEDULE_CLASSES:
      for k, m in _GRID:
        sched = cls(k, m)
        timeline = schedule.simulate(sched, forward_time=1.0, backward_time=2.0)
        self.assertEqual(len(timeline.start), 2 * k * m)
        for task, start in timeline.start.items():
          for dep in sched.dependencies(task):
            self.assertGreaterEqual(start, timeline.end[dep])

  def test_gpipe_makespan(self):
    # Forward phase of M + K - 1 unit ticks, backward phase as long at 2 units each.
    timeline = schedule.simulate(schedule.GPipeSchedule(3, 4), 1.0, 2.0)
    self.assertEqual(timeline.makespan, 18.0)
    self.assertEqual(timeline.start[B(2, 3)], 6.0)
    self.assertEqual(timeline.end[B(0, 0)], 18.0)
    self.assertAlmostEqual(timeline.bubble_fraction, 2 / 6)

  def test_per_cell_durations(self):
    # The slow middle cell sets the pace: cell 2 waits for it each micro-batch.
    timeline = schedule.simulate(schedule.GPipeSchedule(3, 2), [1, 3, 1], [1, 1, 1])
    self.assertEqual(timeline.start[F(2, 0)], 4.0)
    self.assertEqual(timeline.start[F(2, 1)], 7.0)

  def test_bad_durations(self):
    gpipe = schedule.GPipeSchedule(3, 2)
    with self.assertRaisesRegex(ValueError, 'forward_time'):
      schedule.simulate(gpipe, forward_time=0)
    with self.assertRaisesRegex(ValueError, 'backward_time'):
      schedule.simulate(gpipe, backward_time=[1, 2])

  def test_deadlock_is_reported(self):

    class BackwardFirst(schedule.Schedule):

      def order_for_cell(self, cell):
        return [B(cell, 0), F(cell, 0)]

    with self.assertRaisesRegex(RuntimeError, 'deadlock'):
      schedule.simulate(BackwardFirst(2, 1))


class MakeScheduleTest(unittest.TestCase):

  def test_names(self):
    self.assertIsInstance(schedule.make_schedule('gpipe', 2, 3),
                          schedule.GPipeSchedule)
    one_f_one_b = schedule.make_schedule('1f1b', 2, 3)
    self.assertIsInstance(one_f_one_b, schedule.OneFOneBSchedule)
    self.assertEqual((one_f_one_b.num_cells, one_f_one_b.num_micro_batches), (2, 3))

  def test_unknown_name_lists_valid_names(self):
    with self.assertRaises(ValueError) as ctx:
      schedule.make_schedule('pipedream', 2, 3)
    message = str(ctx.exception)
    self.assertIn('pipedream', message)
    self.assertIn('gpipe', message)
    self.assertIn('1f1b', message)

  def test_bad_sizes(self):
    for k, m in ((0, 1), (1, 0), (-2, 3), (2, 1.5), (True, 2)):
      with self.assertRaises(ValueError, msg=f'K={k} M={m}'):
        schedule.make_schedule('gpipe', k, m)

  def test_bad_task_kind(self):
    with self.assertRaisesRegex(ValueError, "'F' or 'B'"):
      Task('X', 0, 0)


if __name__ == '__main__':
  unittest.main()
