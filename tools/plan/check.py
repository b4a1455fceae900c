"""Puts the planner's estimates beside measured tools.benchmark rows: throughput ratios, ranks and memory.

The check of tools/plan/lib.py's model against real steps (``python -m
tools.plan --compare=ROWS.json``; docs/planning.md shows one). Pure Python
over the rows' dicts.
"""

from __future__ import annotations

import math
from typing import Sequence

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import memory
from tools.plan import lib as plan_lib

__all__ = ['Calibrate', 'Compare']

MIB = plan_lib.MIB
REMATS = plan_lib.REMATS


def Calibrate(model: plan_lib.Model, rows: Sequence[dict], batch_size: int
              ) -> tuple[float, float]:
  """(flops_per_second, layer_pass_seconds) that best explain the rows'
  worker CPU time per step (``device_busy_seconds_per_step``: processes
  mode), by least squares over every row's every device.

  The planner's model of a device's work per step: each of its stages s
  runs M forwards, M backwards and M weight gradients of ``flops_s`` x b
  FLOPs each (the backward (1 + r_s) of it, r_s its recompute share), and
  2 M passes (F, and B or BW) through its n_s layers: busy = flops /
  flops_per_second + passes x layer_pass_seconds.

  Raises:
    plan_lib.PlanError: fewer than two rows with worker CPU times, or
      times that no positive speed and pass cost explain.
  """
  xs, ys = [], []
  for r in _Rows(rows):
    busy = r.get('device_busy_seconds_per_step')
    if not busy:
      continue
    lo = _LayoutOf(r)
    plan = plan_lib.Evaluate(model, lo, batch_size)
    sched = schedule_lib.Make(lo.schedule, lo.num_partitions,
                              lo.num_micro_batches, lo.num_virtual_stages)
    kept = memory.KeptForwards(sched, lo.remat)
    m = lo.num_micro_batches
    b = -(-batch_size // m)
    flops = [0.0] * lo.num_partitions
    passes = [0.0] * lo.num_partitions
    start = 0
    for s, n in enumerate(plan.balance):
      stage_flops = sum(c.flops for c in model.layers[start:start + n]) * b
      start += n
      share = sum((s, j) not in kept for j in range(m)) / m
      d = sched.DeviceOf(s)
      flops[d] += m * stage_flops * (3 + share)
      passes[d] += 2 * m * n
    xs += list(zip(flops, passes))
    ys += list(busy)
  if len(ys) < 2:
    raise plan_lib.PlanError('Calibrate needs rows measured with '
                             '--devices=processes (their worker CPU times).')
  # Normal equations of y = a x1 + c x2.
  s11 = sum(x1 * x1 for x1, _ in xs)
  s12 = sum(x1 * x2 for x1, x2 in xs)
  s22 = sum(x2 * x2 for _, x2 in xs)
  t1 = sum(x1 * y for (x1, _), y in zip(xs, ys))
  t2 = sum(x2 * y for (_, x2), y in zip(xs, ys))
  det = s11 * s22 - s12 * s12
  a = (t1 * s22 - t2 * s12) / det if det else 0.0
  c = (s11 * t2 - s12 * t1) / det if det else 0.0
  if c < 0:  # No pass cost: the speed alone.
    a, c = t1 / s11, 0.0
  if a <= 0:
    raise plan_lib.PlanError('The rows\' worker CPU times do not grow with '
                             'their FLOPs; nothing to calibrate from.')
  return 1.0 / a, c


def _Rows(rows: Sequence[dict]) -> list[dict]:
  """The pipelined training rows of one replica the planner models."""
  return [r for r in rows if r['pipeline'] and r['mode'] == 'train' and
          r['num_replicas'] == 1 and r['remat'] in REMATS and
          not r['single_core']]


def _LayoutOf(r: dict) -> plan_lib.Layout:
  # Rows of a benchmark run before --schedules have no schedule: 'gpipe'.
  return plan_lib.Layout(r['num_partitions'], 1, r['num_micro_batches'],
                         r.get('schedule', 'gpipe'),
                         r.get('num_virtual_stages', 1), r['remat'])


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
  fullest device's estimate (max of Plan.step_bytes), and their workers'
  CPU times calibrate the planner's speed and per-pass cost (Calibrate)
  first. Spearman rank correlations of both close the table.

  Raises:
    plan_lib.PlanError: no row to compare with.
  """
  rows = _Rows(rows)
  if not rows:
    raise plan_lib.PlanError(
        'No pipelined training row of one replica with remat '
        f"{' or '.join(REMATS)} to compare with.")
  per_device = all(r.get('device_peak_memory_bytes') for r in rows)
  speed, pass_seconds, calibrated = 1e12, 0.0, ''
  if all(r.get('device_busy_seconds_per_step') for r in rows):
    speed, pass_seconds = Calibrate(model, rows, batch_size)
    calibrated = (f' Planner calibrated on the rows\' worker CPU time: '
                  f'{speed / 1e9:.1f} GFLOP/s and {1e6 * pass_seconds:.0f} '
                  'us per layer per pass (plan_check.Calibrate).')
  plans = [plan_lib.Evaluate(model, _LayoutOf(r), batch_size, speed,
                             pass_seconds) for r in rows]
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
      f'rows).{calibrated}')
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
