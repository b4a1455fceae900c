"""Formats the benchmark's result rows as the markdown tables and target checks it prints.

Pure functions of the rows tools/benchmark/lib.Measure returns (and of the
grid they came from); they run no TensorFlow op.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from tools.benchmark import lib

__all__ = ['Find', 'Ideal', 'ReplicaTable', 'ScheduleTable', 'Schedules',
           'SingleCoreTargets', 'Table1', 'Table2', 'Targets', 'WithSpeedups',
           'DeviceTable', 'PredictionTable']


def Find(rows: Sequence[dict], k: int, m: int, remat: str,
         mode: str = 'train', num_replicas: int = 1,
         schedule: str = 'gpipe') -> dict | None:
  """The pipelined row with these K, M, remat, mode, R and schedule, or None."""
  for r in rows:
    if (r['pipeline'] and r['num_partitions'] == k and
        r['num_micro_batches'] == m and r['remat'] == remat and
        r['mode'] == mode and r['num_replicas'] == num_replicas and
        r['schedule'] == schedule):
      return r
  return None


def Schedules(rows: Sequence[dict]) -> list[str]:
  """The schedules of the pipelined rows, in order of first appearance."""
  names = []
  for r in rows:
    if r['pipeline'] and r['schedule'] not in names:
      names.append(r['schedule'])
  return names


def Ideal(k: int, m: int) -> float:
  """The bubble-bound speed-up of K cells over M micro-batches: K*M/(M+K-1)."""
  return k * m / (m + k - 1)


def Table2(rows: Sequence[dict], partitions: Sequence[int],
           micro_batches: Sequence[int], remats: Sequence[str],
           inference: bool) -> str:
  """Throughput of the K x M grid, normalised to K=2 M=1 of the same kind."""
  lines = ['Table 2 (throughput, normalised to K=2 M=1 of the same remat; '
           'ideal K*M/(M+K-1) in brackets)',
           '| remat | K | ' + ' | '.join(f'M={m}' for m in micro_batches) +
           ' |',
           '|---|---|' + '---|' * len(micro_batches)]
  kinds = [(remat, 'train') for remat in remats]
  if inference:
    kinds.append(('never', 'inference'))
  for remat, mode in kinds:
    ref = Find(rows, 2, 1, remat, mode)
    for k in partitions:
      cells = []
      for m in micro_batches:
        r = Find(rows, k, m, remat, mode)
        rel = (f"{r['examples_per_sec'] / ref['examples_per_sec']:.2f}"
               if ref else 'n/a')
        cells.append(f'{rel} ({Ideal(k, m):.2f})' if k > 1 else rel)
      kind = remat if mode == 'train' else mode
      lines.append(f'| {kind} | {k} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def Table1(rows: Sequence[dict]) -> str:
  """Peak step memory, examples/sec and (when measured) x single-core of every row.

  When any row has a schedule other than 'gpipe' or took the loss-inside
  path, two more columns say each row's schedule and gradient path; when any
  has a ``model_peak_bytes``, the memory model's peak follows the measured.
  """
  speedups = any(r.get('speedup_vs_single_core') is not None for r in rows)
  modelled = any(r.get('model_peak_bytes') is not None for r in rows)
  schedules = any(r['schedule'] != 'gpipe' or
                  r['loss_inside'] for r in rows)
  lines = ['\nTable 1 (peak step memory, MiB; examples/sec' +
           ('; x single-core: examples/sec over the single-core baseline of '
            'the same mode' if speedups else '') +
           ('; path: loss inside = ComputeLossAndGradients, tape = FProp + '
            'GradientTape' if schedules else '') +
           ('; model MiB: the memory model, all devices at its worst moment'
            if modelled else '') + ')',
           '| configuration |' + (' schedule | path |' if schedules else '') +
           ' peak MiB |' + (' model MiB |' if modelled else '') +
           ' examples/sec |' + (' x single-core |' if speedups else ''),
           '|---|---|---|' + ('---|---|' if schedules else '') +
           ('---|' if modelled else '') + ('---|' if speedups else '')]
  for r in rows:
    line = f'| {lib.Label(r, with_schedule=not schedules)} |'
    if schedules:
      line += (f' {lib.ScheduleLabel(r) if r["pipeline"] else "-"} | '
               f"{_Path(r)} |")
    line += f" {r['peak_memory_bytes'] / 2**20:.1f} |"
    if modelled:
      line += f" {_MiB(r.get('model_peak_bytes'))} |"
    line += f" {r['examples_per_sec']:.0f} |"
    if speedups:
      line += f" {_Times(r.get('speedup_vs_single_core'))} |"
    lines.append(line)
  return '\n'.join(lines)


def _Path(row: dict) -> str:
  if row['mode'] != 'train':
    return 'forward'
  return 'loss inside' if row['loss_inside'] else 'tape'


def ScheduleTable(rows: Sequence[dict], micro_batches: Sequence[int],
                  remats: Sequence[str], num_partitions: int = 2) -> str:
  """Every schedule's training rows at K = ``num_partitions`` (R=1).

  One line per schedule x remat x M: examples/sec, x single-core (when
  measured), peak step memory and the memory model's peak (all devices at
  its worst moment; schedule.memory) over the sizes the traced step holds
  (model MiB) and over tools.plan's estimate of them (plan MiB).
  """
  k = num_partitions
  path = 'loss inside' if any(r['loss_inside'] for r in rows) else 'tape'
  lines = [f'\nSchedules at K={k} (training, R=1; path of every row: {path})',
           '| schedule | remat | M | examples/sec | x single-core | peak MiB | '
           'model MiB | plan MiB |',
           '|---|---|---|---|---|---|---|---|']
  for name in Schedules(rows):
    for remat in remats:
      for m in micro_batches:
        r = Find(rows, k, m, remat, schedule=name)
        if r is None:
          continue
        lines.append(f'| {lib.ScheduleLabel(r)} | {remat} | {m} | '
                     f"{r['examples_per_sec']:.0f} | "
                     f"{_Times(r.get('speedup_vs_single_core'))} | "
                     f"{r['peak_memory_bytes'] / 2**20:.1f} | "
                     f"{_MiB(r.get('model_peak_bytes'))} | "
                     f"{_MiB(r.get('plan_peak_bytes'))} |")
  return '\n'.join(lines)


def _MiB(value: float | None) -> str:
  return '-' if value is None else f'{value / 2**20:.1f}'


def WithSpeedups(rows: Sequence[dict]) -> list[dict]:
  """The rows, each with ``speedup_vs_single_core``.

  Its examples/sec over the single-core baseline row of the same mode (None
  where there is no such baseline).
  """
  base = {r['mode']: r for r in rows if r['single_core']}
  out = []
  for r in rows:
    b = base.get(r['mode'])
    speedup = (None if b is None else
               r['examples_per_sec'] / b['examples_per_sec'])
    out.append(dict(r, speedup_vs_single_core=speedup,
                    speedup_rounds=_RoundRatios(b, r)))
  return out


def _RoundRatios(base: dict | None, row: dict) -> list[float] | None:
  """The row's speedup over the baseline in each round: the baseline's round
  r runs just before the grid's round r, so a slow spell of the machine
  slows both sides of a ratio alike (None without per-round times)."""
  if base is None:
    return None
  b, t = (base.get('seconds_per_step_rounds'),
          row.get('seconds_per_step_rounds'))
  if not b or not t or len(b) != len(t):
    return None
  return [x / y for x, y in zip(b, t)]


def SingleCoreTargets(rows: Sequence[dict], num_cores: int,
                      baseline_rounds: Sequence[float] = ()) -> str:
  """The issue's targets against the single-core baseline, measured, as text.

  ``rows`` come from WithSpeedups. The best K=2 training row (R=1) should
  reach 1.85x the baseline and the best K=2 row with remat 'always' 1.5x; on
  ``num_cores`` cores ``num_cores``x is the physical limit.
  ``baseline_rounds``: the training baseline's examples/sec in every round.
  """
  train = [r for r in rows if r['mode'] == 'train' and not r['single_core']
           and r.get('speedup_vs_single_core') is not None]
  if not train:
    return '\nSingle-core baseline: not measured.'
  lines = [f'\nVersus the single-core baseline (SequentialLayer, one device, '
           f'one thread; {num_cores} cores make {num_cores:.1f}x the physical '
           'limit)']
  if baseline_rounds:
    lines.append(f'  baseline examples/sec per round, interleaved with the '
                 f"grid's: {', '.join(f'{v:.0f}' for v in baseline_rounds)}")
  lines.append('  best training: ' + _Described(_Best(train)))
  k2 = [r for r in train if r['pipeline'] and r['num_partitions'] == 2 and
        r['num_replicas'] == 1]
  for text, candidates, target in (
      ('best K=2 training', k2, 1.85),
      ("best K=2 training with remat 'always'",
       [r for r in k2 if r['remat'] == 'always'], 1.5)):
    if candidates:
      best = _Best(candidates)
      ok = best['speedup_vs_single_core'] >= target
      lines.append(f"  [{'ok' if ok else 'MISSED'}] {text}: "
                   f'{_Described(best)}, target >= {target}x'
                   f'{_RoundsMet(best, target)}')
  return '\n'.join(lines)


def _RoundsMet(row: dict, target: float) -> str:
  """'; per round 1.71-1.93x, met in 3 of 5' (nothing without rounds)."""
  ratios = row.get('speedup_rounds')
  if not ratios:
    return ''
  met = sum(v >= target for v in ratios)
  return (f'; per round {min(ratios):.2f}-{max(ratios):.2f}x, met in {met} of '
          f'{len(ratios)}')


def _Best(rows: Sequence[dict]) -> dict:
  return max(rows, key=lambda r: r['speedup_vs_single_core'])


def _Described(row: dict) -> str:
  return f"{_Times(row['speedup_vs_single_core'])} ({lib.Label(row)})"


def _Times(speedup: float | None) -> str:
  return 'n/a' if speedup is None else f'{speedup:.2f}x'


def ReplicaTable(rows: Sequence[dict], num_devices: int,
                 replicas: Sequence[int], micro_batches: Sequence[int],
                 remats: Sequence[str]) -> str:
  """Throughput and peak memory of the R x K grid over the same D devices."""
  d, micro, first = num_devices, list(micro_batches), replicas[0]
  lines = [f'\nR replicas x K cells over the same {d} devices and global batch '
           f'(throughput normalised to R={first} K={d // first} M={micro[0]} '
           'of the same remat; peak step memory MiB in brackets)',
           '| remat | R x K | ' + ' | '.join(f'M={m}' for m in micro) + ' |',
           '|---|---|' + '---|' * len(micro)]
  for remat in remats:
    ref = Find(rows, d // first, micro[0], remat, num_replicas=first)
    for r in replicas:
      cells = []
      for m in micro:
        row = Find(rows, d // r, m, remat, num_replicas=r)
        rel = row['examples_per_sec'] / ref['examples_per_sec']
        cells.append(f"{rel:.2f} ({row['peak_memory_bytes'] / 2**20:.1f})")
      lines.append(f'| {remat} | {r} x {d // r} | ' + ' | '.join(cells) +
                   ' |')
  return '\n'.join(lines)


def Targets(rows: Sequence[dict], partitions: Sequence[int],
            micro_batches: Sequence[int]) -> str:
  """The issue's performance targets, measured, as text."""
  seq = [r for r in rows if not r['pipeline'] and not r['single_core']][0]
  checks = []
  for mode in ('train', 'inference'):
    k2m1 = Find(rows, 2, 1, 'never', mode)
    k2m8 = Find(rows, 2, 8, 'never', mode)
    if k2m1 and k2m8:
      s = k2m8['examples_per_sec'] / k2m1['examples_per_sec']
      checks.append((f'{mode}: K=2 M=8 vs K=2 M=1 (remat never): {s:.2f}x, '
                     f'target >= 1.6x (ideal {Ideal(2, 8):.2f})', s >= 1.6))
  k1 = Find(rows, 1, 1, 'never')
  if k1:
    slow = seq['examples_per_sec'] / k1['examples_per_sec'] - 1
    checks.append((f'K=1 M=1 pipeline vs SequentialLayer: {100 * slow:+.1f}% '
                   'time, target <= +5%', slow <= 0.05))
  never1 = Find(rows, 2, 1, 'never')
  always8 = Find(rows, 2, 8, 'always')
  if never1 and always8 and never1['peak_memory_bytes'] > 0:
    frac = always8['peak_memory_bytes'] / never1['peak_memory_bytes']
    checks.append((f'peak memory remat always M=8 / remat never M=1 (K=2): '
                   f'{100 * frac:.0f}%, target <= 35%', frac <= 0.35))
  for k in partitions:
    for m in micro_batches:
      a, n = Find(rows, k, m, 'always'), Find(rows, k, m, 'never')
      if a and n:
        extra = n['examples_per_sec'] / a['examples_per_sec'] - 1
        checks.append((f'recompute cost K={k} M={m}: {100 * extra:+.0f}% step '
                       'time, target <= +35%', extra <= 0.35))
  return '\nTargets\n' + '\n'.join(
      f"  [{'ok' if ok else 'MISSED'}] {text}" for text, ok in checks)



def DeviceTable(rows: Sequence[dict]) -> str:
  """Per-device figures of rows timed on worker processes (--devices=processes).

  One line per row that has them: step time (the median round's), each
  device's busy time (its worker's CPU time per step, a mean over every
  round) and its share of the mean step, each device's peak
  step memory beside the memory model's peak of that device (its own
  allocator's worst moment; '-' for rows the model leaves out), the MiB
  each sent per step (measured on its sockets) and what the schedule's
  boundary tensors alone make (all devices together).
  """
  lines = ['\nPer device (worker processes; lists are device 0 / device 1 / '
           '...; busy = worker CPU time per step; model = the memory model\'s '
           'peak of each device; sent = bytes on its sockets; boundary = what '
           'the schedule must send, all devices)',
           '| configuration | schedule | step ms | busy ms | busy % of step | '
           'peak MiB | model MiB | sent MiB | boundary MiB |',
           '|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    busy = r.get('device_busy_seconds_per_step')
    if busy is None:
      continue
    step = statistics.median(r['seconds_per_step_rounds'])
    # The busy times are means over every round: their share is of the mean
    # step (of the median, one slow round put a worker at 115% busy).
    mean = statistics.mean(r['seconds_per_step_rounds'])
    boundary = r.get('boundary_bytes_per_step')
    model = r.get('device_model_peak_bytes')
    lines.append(
        f"| {lib.Label(r, with_schedule=False)} | "
        f"{lib.ScheduleLabel(r) if r['pipeline'] else '-'} | "
        f'{1000 * step:.0f} | ' + _Each(busy, 1000, '.0f') + ' | ' +
        _Each([b / mean for b in busy], 100, '.0f') + ' | ' +
        _Each(r['device_peak_memory_bytes'], 1 / 2**20, '.1f') + ' | ' +
        (_Each(model, 1 / 2**20, '.1f') if model else '-') + ' | ' +
        _Each(r['device_bytes_sent_per_step'], 1 / 2**20, '.2f') + ' | ' +
        ('-' if boundary is None else f'{boundary / 2**20:.2f}') + ' |')
  return '\n'.join(lines)


def AccumulationTable(rows: Sequence[dict]) -> str:
  """Each pipelined training row's work against gradient accumulation:
  the devices' summed busy time per step beside that of the SequentialLayer
  running the same M micro-batches in turn on one device
  (lib.AccumulationConfigs), rows timed on worker processes. Issue 40's
  target: within 1.15x."""
  plain = {(r['num_micro_batches'], r['dtype']): r for r in rows
           if not r['pipeline'] and r['num_micro_batches'] > 1 and
           r.get('device_busy_seconds_per_step')}
  lines = ['\nWork against gradient accumulation (summed busy ms per step: '
           'every device of the row / the SequentialLayer running the same '
           'micro-batches in turn)',
           '| configuration | schedule | summed busy ms | accumulation busy ms '
           '| ratio |', '|---|---|---|---|---|']
  for r in rows:
    base = plain.get((r['num_micro_batches'], r['dtype']))
    busy = r.get('device_busy_seconds_per_step')
    if not (r['pipeline'] and r['mode'] == 'train' and base and busy):
      continue
    total = sum(busy)
    ref = sum(base['device_busy_seconds_per_step'])
    lines.append(f"| {lib.Label(r, with_schedule=False)} | "
                 f'{lib.ScheduleLabel(r)} | {1000 * total:.0f} | '
                 f'{1000 * ref:.0f} | '
                 + (f'{total / ref:.2f} |' if ref > 0 else '- |'))
  return '\n'.join(lines)


def PredictionTable(rows: Sequence[dict]) -> str:
  """The step the schedule replayed on each row's measured pieces predicts
  beside the measured step, and the simulated bubble beside the measured
  one (rows with a ``prediction``: tools.benchmark --devices=processes
  --predict).

  F, B, W, BW and BW recomputing its forward are the means over the stages
  of the pieces' worker CPU time (ms); comm is one boundary message's delay
  + the CPU time it costs each side; 'from wall' is the step predicted from
  the pieces' fastest wall times instead.
  """
  lines = ['\nMeasured step beside the one predicted from the engine\'s '
           'pieces timed on the workers (ms; F/B/W/BW: worker CPU time, mean '
           'over stages; BW rc: a BW that recomputes its forward; comm: '
           'delay + CPU per side per message; bubble measured = 1 - worker '
           'CPU time / step; chief = this process\'s CPU time per step)',
           '| configuration | schedule | step ms | predicted ms | '
           'step / predicted | from wall ms | F | B | W | BW | BW rc | '
           'comm | bubble measured | bubble simulated | chief ms |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    p = r.get('prediction')
    if p is None:
      continue
    step = statistics.median(r['seconds_per_step_rounds'])
    mean = lambda key: 1000 * statistics.fmean(p[key])  # pylint: disable=cell-var-from-loop
    chief = r.get('chief_busy_seconds_per_step')
    wall = p.get('predicted_seconds_wall')
    lines.append(
        f"| {lib.Label(r, with_schedule=False)} | {lib.ScheduleLabel(r)} | "
        f"{1000 * step:.0f} | {1000 * p['predicted_seconds']:.0f} | "
        f"{step / p['predicted_seconds']:.2f} | "
        + ('-' if wall is None else f'{1000 * wall:.0f}') + ' | '
        f"{mean('forward_seconds'):.1f} | {mean('backward_seconds'):.1f} | "
        f"{mean('weight_seconds'):.1f} | "
        f"{mean('backward_weight_seconds'):.1f} | "
        f"{mean('backward_weight_remat_seconds'):.1f} | "
        f"{1000 * p['comm_seconds']:.2f} + "
        f"{1000 * p.get('comm_cpu_seconds', 0.0):.2f} | "
        f"{p['measured_bubble']:.2f} | {p['simulated_bubble']:.2f} | "
        + ('-' if chief is None else f'{1000 * chief:.0f}') + ' |')
  return '\n'.join(lines)


def _Each(values: Sequence[float], scale: float, fmt: str) -> str:
  return ' / '.join(format(v * scale, fmt) for v in values)
