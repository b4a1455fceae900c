"""Puts the planner's estimates beside measured tools.benchmark rows: throughput ratios, ranks and memory.

The check of tools/plan_lib.py's model against real steps (``python -m
tools.plan --compare=ROWS.json``; docs/planning.md shows one). Pure Python
over the rows' dicts.
"""

from __future__ import annotations

import math
from typing import Sequence

from tools import plan_lib

__all__ = ['Compare']

MIB = plan_lib.MIB
REMATS = plan_lib.REMATS


def Compare(model: plan_lib.Model, rows: Sequence[dict],
            batch_size: int) -> str:
  """The planner's estimates beside measured tools.benchmark rows, as markdown.

  Takes the pipelined training rows of one replica with remat 'never' or
  'always'. Throughput is shown relative to the first such row (the estimate's
  absolute scale is arbitrary); memory beside the measured peak step memory.
  Rows of the shared mode (logical devices of one process) measured one
  allocator for all devices, their gradients and activations together, so
  the estimate shown is Plan.total_step_bytes; rows of the processes mode
  (tools.benchmark --devices=processes) measured each device's own
  allocator, so the fullest device's measured peak is shown beside the
  fullest device's estimate (max of Plan.step_bytes). Spearman rank
  correlations of both close the table.

  Raises:
    plan_lib.PlanError: no row to compare with.
  """
  rows = [r for r in rows if r['pipeline'] and r['mode'] == 'train' and
          r['num_replicas'] == 1 and r['remat'] in REMATS and
          not r['single_core']]
  if not rows:
    raise plan_lib.PlanError(
        'No pipelined training row of one replica with remat '
        f"{' or '.join(REMATS)} to compare with.")
  # Rows of a benchmark run before --schedules have no schedule: 'gpipe'.
  layouts = [plan_lib.Layout(r['num_partitions'], 1, r['num_micro_batches'],
                             r.get('schedule', 'gpipe'),
                             r.get('num_virtual_stages', 1), r['remat'])
             for r in rows]
  plans = [plan_lib.Evaluate(model, lo, batch_size) for lo in layouts]
  per_device = all(r.get('device_peak_memory_bytes') for r in rows)
  if per_device:
    peaks = [max(r['device_peak_memory_bytes']) for r in rows]
    estimates = [max(p.step_bytes) for p in plans]
  else:
    peaks = [r['peak_memory_bytes'] for r in rows]
    estimates = [p.total_step_bytes for p in plans]
  measured = [r['examples_per_sec'] for r in rows]
  estimated = [p.examples_per_sec for p in plans]
  rank_m, rank_e = _Ranks([-x for x in measured]), _Ranks(
      [-float(f'{x:.9g}') for x in estimated])
  which = ' (fullest device)' if per_device else ' (all devices)'
  lines = ['| configuration | examples/sec | measured x | planner x | rank '
           f'measured | rank planner | peak MiB measured{which} | step MiB '
           f'planner{which} |',
           '|---|---|---|---|---|---|---|---|']
  for r, p, rm, re, peak, estimate in zip(rows, plans, rank_m, rank_e, peaks,
                                          estimates):
    lo = p.layout
    lines.append(
        f'| {lo.Label().replace(" R=1", "")} | {r["examples_per_sec"]:.0f} | '
        f'{r["examples_per_sec"] / measured[0]:.2f} | '
        f'{p.examples_per_sec / estimated[0]:.2f} | {rm:g} | {re:g} | '
        f'{peak / MIB:.1f} | {estimate / MIB:.1f} |')
  memory = _Spearman(_Ranks(peaks), _Ranks(estimates))
  lines.append(
      f'\nSpearman rank correlation, planner vs measured: throughput '
      f'{_Spearman(rank_m, rank_e):.2f}, memory {memory:.2f} ({len(rows)} '
      'rows).')
  return '\n'.join(lines)


def _Ranks(values: Sequence[float]) -> list[float]:
  """1-based ranks, ascending; ties share their average rank."""
  order = sorted(range(len(values)), key=lambda i: values[i])
  ranks = [0.0] * len(values)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    for t in order[i:j + 1]:
      ranks[t] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def _Spearman(a: Sequence[float], b: Sequence[float]) -> float:
  """Pearson correlation of two rank lists (nan when one is constant)."""
  ma, mb = sum(a) / len(a), sum(b) / len(b)
  cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
  var = math.sqrt(sum((x - ma)**2 for x in a) * sum((y - mb)**2 for y in b))
  return cov / var if var else math.nan
