"""Tests for gpipe_tf.pipeline.partition: optimal, never-empty, deterministic balances."""

import itertools
import math
import random
import unittest

# Lets `python tests/partition_test.py` import the package without installing it.

from gpipe_tf.pipeline import partition  # pylint: disable=wrong-import-position
from gpipe_tf.pipeline.partition import PartitionError  # pylint: disable=wrong-import-position


def _histogram_rule(costs, num_cells):
  """The cumulative-histogram rule the new partitioner replaces (test-only reference).

  Cell k-1 ends just before the first layer whose inclusive cumulative cost reaches
  k * total / K; the last cell takes the rest. Cells may come out empty.
  """
  total = sum(costs)
  cumulative = list(itertools.accumulate(costs))
  bounds = [0]
  for k in range(1, num_cells):
    threshold = k * total / num_cells
    bounds.append(next(i for i, c in enumerate(cumulative) if c >= threshold))
  bounds.append(len(costs))
  return [b - a for a, b in zip(bounds, bounds[1:])]


def _max_cell_cost(costs, counts):
  """Largest cell cost; works for balances with empty cells too."""
  result, start = 0.0, 0
  for count in counts:
    result = max(result, sum(costs[start:start + count]))
    start += count
  return result


def _all_balances(num_layers, num_cells):
  """Every split of num_layers layers into num_cells non-empty contiguous cells."""
  for cuts in itertools.combinations(range(1, num_layers), num_cells - 1):
    bounds = (0,) + cuts + (num_layers,)
    yield [b - a for a, b in zip(bounds, bounds[1:])]


def _variance(values):
  """Population variance (the tie-break's measure)."""
  mean = sum(values) / len(values)
  return sum((v - mean) ** 2 for v in values) / len(values)


def _sum_of_squares(costs, balance):
  return sum(c * c for c in partition.CellCosts(costs, balance))


class HistogramRuleCounterExamplesTest(unittest.TestCase):
  """The two published failure cases of the histogram rule, and the fix."""

  def test_reference_rule_reproduces_published_facts(self):
    self.assertEqual(_histogram_rule([1.0] * 16, 4), [3, 4, 4, 5])
    self.assertIn(0, _histogram_rule([10, 1, 1, 1, 1, 1], 4))

  def test_equal_costs_split_evenly(self):
    costs = [1.0] * 16
    balance = partition.PartitionBalanced(costs, 4)
    self.assertEqual(balance, [4, 4, 4, 4])
    self.assertLess(_max_cell_cost(costs, balance),
                    _max_cell_cost(costs, _histogram_rule(costs, 4)))

  def test_heavy_first_layer_leaves_no_empty_cell(self):
    costs = [10, 1, 1, 1, 1, 1]
    balance = partition.PartitionBalanced(costs, 4)
    self.assertEqual(balance, [1, 2, 2, 1])
    self.assertNotIn(0, balance)
    self.assertEqual(partition.CellCosts(costs, balance), [10.0, 2.0, 2.0, 1.0])
    self.assertLess(_max_cell_cost(costs, balance),
                    _max_cell_cost(costs, _histogram_rule(costs, 4)))

  def test_never_worse_than_histogram_rule(self):
    rng = random.Random(7)
    for _ in range(300):
      num_layers = rng.randint(1, 30)
      num_cells = rng.randint(1, num_layers)
      costs = [rng.choice([0.0, rng.uniform(0, 10)]) for _ in range(num_layers)]
      balance = partition.PartitionBalanced(costs, num_cells)
      self.assertLessEqual(
          _max_cell_cost(costs, balance),
          _max_cell_cost(costs, _histogram_rule(costs, num_cells)) + 1e-9,
          msg=f'costs={costs} K={num_cells}')


def _random_integer_problem(rng):
  """(num_layers, num_cells, costs): 1-9 layers of integer cost 0-6 into 1-4
  cells, small enough to enumerate every split."""
  num_layers = rng.randint(1, 9)
  num_cells = rng.randint(1, min(4, num_layers))
  return num_layers, num_cells, [rng.randint(0, 6) for _ in range(num_layers)]


class PartitionBalancedTest(unittest.TestCase):

  def test_matches_brute_force_on_integer_costs(self):
    # Integer costs make ties exact, so the full objective can be checked exactly.
    rng = random.Random(0)
    for _ in range(400):
      num_layers, num_cells, costs = _random_integer_problem(rng)
      balance = partition.PartitionBalanced(costs, num_cells)
      msg = f'costs={costs} K={num_cells} got {balance}'
      candidates = list(_all_balances(num_layers, num_cells))
      best_max = min(_max_cell_cost(costs, b) for b in candidates)
      ties = [b for b in candidates if _max_cell_cost(costs, b) == best_max]
      best_squares = min(_sum_of_squares(costs, b) for b in ties)
      ties = [b for b in ties if _sum_of_squares(costs, b) == best_squares]
      self.assertEqual(len(balance), num_cells, msg=msg)
      self.assertTrue(all(count >= 1 for count in balance), msg=msg)
      self.assertEqual(sum(balance), num_layers, msg=msg)
      self.assertEqual(_max_cell_cost(costs, balance), best_max, msg=msg)
      self.assertEqual(_sum_of_squares(costs, balance), best_squares, msg=msg)
      self.assertEqual(balance, max(ties), msg=msg)

  def test_weighted_cells_match_brute_force(self):
    # Cell c costs weights[c] x its layers' costs; integer weights keep ties
    # exact. The minimal maximum is checked against every split.
    rng = random.Random(1)
    for _ in range(300):
      num_layers, num_cells, costs = _random_integer_problem(rng)
      weights = [rng.randint(1, 4) for _ in range(num_cells)]

      def weighted_max(b, costs=costs, weights=weights):
        cells = partition.CellCosts(costs, b)
        return max(w * c for w, c in zip(weights, cells))

      balance = partition.PartitionBalanced(costs, num_cells, weights)
      best = min(weighted_max(b)
                 for b in _all_balances(num_layers, num_cells))
      self.assertEqual(weighted_max(balance), best,
                       msg=f'costs={costs} weights={weights} got {balance}')

  def test_weights_move_layers_to_lighter_cells(self):
    # A cell that also recomputes its forward (4/3 the work) takes fewer.
    self.assertEqual(partition.PartitionBalanced([1.0] * 16, 2), [8, 8])
    self.assertEqual(
        partition.PartitionBalanced([1.0] * 16, 2, [4 / 3, 1.0]), [7, 9])
    for bad in ([1.0], [1.0, 0.0], [1.0, math.inf]):
      with self.assertRaisesRegex(PartitionError, 'weights must be 2'):
        partition.PartitionBalanced([1.0] * 4, 2, bad)

  def test_matches_brute_force_on_float_costs(self):
    rng = random.Random(1)
    for _ in range(400):
      num_layers = rng.randint(1, 9)
      num_cells = rng.randint(1, min(4, num_layers))
      costs = [rng.uniform(0, 5) for _ in range(num_layers)]
      balance = partition.PartitionBalanced(costs, num_cells)
      msg = f'costs={costs} K={num_cells} got {balance}'
      candidates = list(_all_balances(num_layers, num_cells))
      best_max = min(_max_cell_cost(costs, b) for b in candidates)
      ties = [b for b in candidates
              if math.isclose(_max_cell_cost(costs, b), best_max, rel_tol=1e-9)]
      variances = [_variance(partition.CellCosts(costs, b)) for b in ties]
      self.assertTrue(all(count >= 1 for count in balance), msg=msg)
      self.assertAlmostEqual(_max_cell_cost(costs, balance), best_max, places=9,
                             msg=msg)
      self.assertAlmostEqual(
          _variance(partition.CellCosts(costs, balance)), min(variances),
          places=9, msg=msg)

  def test_float_rounding_does_not_change_the_answer(self):
    # 0.1 and 1/3 are inexact in binary; equal-cost splits must still tie.
    rng = random.Random(2)
    for _ in range(200):
      num_layers = rng.randint(1, 12)
      num_cells = rng.randint(1, num_layers)
      costs = [rng.randint(0, 5) for _ in range(num_layers)]
      expected = partition.PartitionBalanced(costs, num_cells)
      for scale in (0.1, 1 / 3, 1e-7):
        scaled = [c * scale for c in costs]
        self.assertEqual(partition.PartitionBalanced(scaled, num_cells), expected,
                         msg=f'costs={costs} K={num_cells} scale={scale}')

  def test_tie_break_prefers_more_layers_in_earlier_cells(self):
    self.assertEqual(partition.PartitionBalanced([1] * 5, 2), [3, 2])
    self.assertEqual(partition.PartitionBalanced([1] * 7, 3), [3, 2, 2])

  def test_variance_breaks_ties_of_the_maximum(self):
    # Max 10 is forced by the first layer; [1, 1, 4] would also have max 10 but a
    # higher variance than [1, 3, 2] or [1, 2, 3].
    balance = partition.PartitionBalanced([10, 1, 1, 1, 1, 1], 3)
    self.assertEqual(partition.CellCosts([10, 1, 1, 1, 1, 1], balance),
                     [10.0, 3.0, 2.0])

  def test_zero_cost_layers(self):
    self.assertEqual(partition.PartitionBalanced([0, 0, 0], 2), [2, 1])
    balance = partition.PartitionBalanced([0, 5, 0, 0, 5, 0], 2)
    self.assertEqual(partition.CellCosts([0, 5, 0, 0, 5, 0], balance), [5.0, 5.0])
    self.assertEqual(balance, [4, 2])

  def test_one_cell_and_one_layer_per_cell(self):
    self.assertEqual(partition.PartitionBalanced([3, 1, 2], 1), [3])
    self.assertEqual(partition.PartitionBalanced([3, 1, 2], 3), [1, 1, 1])

  def test_more_cells_than_layers_says_what_fits(self):
    with self.assertRaises(PartitionError) as ctx:
      partition.PartitionBalanced([1, 2, 3], 4)
    self.assertIn('cannot split 3 layers into 4 cells', str(ctx.exception))
    self.assertIn('num_partitions <= 3', str(ctx.exception))

  def test_bad_num_partitions(self):
    for bad in (0, -1, 2.0, True):
      with self.assertRaises(PartitionError, msg=repr(bad)) as ctx:
        partition.PartitionBalanced([1, 2, 3], bad)
      self.assertIn('num_partitions', str(ctx.exception))

  def test_no_layers(self):
    with self.assertRaisesRegex(PartitionError, 'at least one layer'):
      partition.PartitionBalanced([], 1)

  def test_bad_cost_names_its_index(self):
    for bad in (-1.0, math.nan, math.inf, '3', None, True):
      with self.assertRaises(PartitionError, msg=repr(bad)) as ctx:
        partition.PartitionBalanced([1.0, 2.0, bad, 4.0], 2)
      self.assertIn('costs[2]', str(ctx.exception))

  def test_error_is_a_value_error(self):
    self.assertTrue(issubclass(PartitionError, ValueError))


class ValidateBalanceTest(unittest.TestCase):

  def test_valid_balance_is_returned_as_list(self):
    self.assertEqual(partition.ValidateBalance((3, 2), 5), [3, 2])
    self.assertEqual(partition.ValidateBalance([3, 2], 5, num_devices=2), [3, 2])

  def test_wrong_sum_suggests_a_balance(self):
    with self.assertRaises(PartitionError) as ctx:
      partition.ValidateBalance([2, 2], 5)
    message = str(ctx.exception)
    self.assertIn('sums to 4', message)
    self.assertIn('5 layers', message)
    self.assertIn('balance=[3, 2]', message)

  def test_more_cells_than_layers_suggests_fewer_cells(self):
    with self.assertRaises(PartitionError) as ctx:
      partition.ValidateBalance([1, 1, 1, 1], 3)
    self.assertIn('balance=[1, 1, 1]', str(ctx.exception))

  def test_non_positive_or_non_int_counts(self):
    for bad in ([3, 0, 2], [3, -1, 3], [3, 1.0, 1], [3, True, 1]):
      with self.assertRaises(PartitionError, msg=repr(bad)) as ctx:
        partition.ValidateBalance(bad, 5)
      self.assertIn('balance[1]', str(ctx.exception))

  def test_empty_balance(self):
    with self.assertRaisesRegex(PartitionError, r'balance=\[5\]'):
      partition.ValidateBalance([], 5)

  def test_more_cells_than_devices(self):
    with self.assertRaises(PartitionError) as ctx:
      partition.ValidateBalance([1, 1, 1, 1], 4, num_devices=2)
    message = str(ctx.exception)
    self.assertIn('only 2 device', message)
    self.assertIn('num_partitions <= 2', message)


class CheckDevicesTest(unittest.TestCase):

  def test_enough_devices(self):
    self.assertIsNone(partition.CheckDevices(2, 2))
    self.assertIsNone(partition.CheckDevices(1, 8))

  def test_too_few_devices_explains_cpu_split(self):
    with self.assertRaises(PartitionError) as ctx:
      partition.CheckDevices(4, 1)
    message = str(ctx.exception)
    self.assertIn('4 cells', message)
    self.assertIn('only 1 device', message)
    self.assertIn('num_partitions <= 1', message)
    self.assertIn('logical devices', message)


class SplitAndCostTest(unittest.TestCase):

  def test_split_by_balance(self):
    self.assertEqual(partition.SplitByBalance('abcde', [3, 2]),
                     [['a', 'b', 'c'], ['d', 'e']])
    self.assertEqual(partition.SplitByBalance([1, 2, 3], [1, 1, 1]),
                     [[1], [2], [3]])

  def test_split_by_balance_rejects_mismatch(self):
    with self.assertRaisesRegex(PartitionError, 'sums to 4'):
      partition.SplitByBalance('abc', [2, 2])

  def test_cell_costs(self):
    self.assertEqual(partition.CellCosts([10, 1, 1, 1, 1, 1], [1, 2, 2, 1]),
                     [10.0, 2.0, 2.0, 1.0])

  def test_cell_costs_rejects_bad_input(self):
    with self.assertRaisesRegex(PartitionError, r'costs\[1\]'):
      partition.CellCosts([1, -2], [1, 1])
    with self.assertRaisesRegex(PartitionError, 'sums to 1'):
      partition.CellCosts([1, 2], [1])


if __name__ == '__main__':
  unittest.main()
