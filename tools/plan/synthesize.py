"""tools.plan --synthesize and --synthesize_table: a model's synthesized schedule, written and drawn, and synthesized against library schedules on paper.

Pure Python over the library (gpipe_tf/pipeline/schedule/synthesize.py and
layout.py) but for Draw, which imports matplotlib:

  * LayerCosts: a plan_lib.Model's layers as layout.LayerCost, F = B = W =
    a layer's FLOPs x micro-batch / flops_per_second (as plan_lib times a
    stage), bytes as plan_lib counts them (memory.StageBytesOf);
  * Report, Draw: the chosen layout in words, its unit-time grid
    (Schedule.ToAscii) and a PNG of its simulated step;
  * Table, FormatTable: at each K, M and budget (a fraction of 1F1B's
    peak), the simulated step and fullest device's peak of 1F1B, of V-Half
    (controllable.VHalf, V = 2, whatever the budget), of the best library
    schedule that fits and of the synthesized one, for L identical layers
    split evenly (V = 1 and V = 2 both tried); the table's layer is
    tools/plan/block.py's Transformer block.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import controllable
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import synthesize
from tools.plan import lib as plan_lib

__all__ = ['Draw', 'FormatTable', 'LayerCosts', 'Report', 'Row', 'Table',
           'Targets']


def LayerCosts(model: plan_lib.Model, micro_batch_size: int,
               flops_per_second: float = 1e12) -> list[layout.LayerCost]:
  """The model's layers as layout.LayerCost for micro-batches of b examples."""
  ins = [model.input_bytes] + [c.output_bytes for c in model.layers[:-1]]
  out = []
  for c, i in zip(model.layers, ins):
    t = max(c.flops * micro_batch_size / flops_per_second, 1e-12)
    out.append(layout.LayerCost(t, t, t, memory.StageBytesOf(
        i, [c.output_bytes], c.num_params, micro_batch_size,
        model.bytes_per_param, model.grad_bytes_per_param, [c.kept_bytes],
        [c.wcut_bytes])))
  return out


def Report(choice: layout.Choice, budget: float) -> str:
  """The choice in words, what it beat, and its unit-time grid."""
  best, lib = choice.synthesized.best, choice.synthesized.best_library
  mib = plan_lib.MIB
  lines = [
      f'Synthesized: {best.source}, V={choice.num_virtual_stages}, balance '
      f'{list(choice.balance)}: simulated step {best.makespan:.4g} s, peak '
      f'MiB per device {", ".join(f"{p / mib:.1f}" for p in best.peaks)} '
      f'within {budget / mib:.1f} MiB.',
      ('Best library schedule within the budget for that V and balance: '
       f'{lib.source}, {lib.makespan:.4g} s.' if lib else
       'No library schedule fits the budget for that V and balance.'),
      f'Layouts considered (V, balance, step): {len(choice.considered)}.',
      '', choice.schedule.ToAscii()]
  return '\n'.join(lines)


def Draw(choice: layout.Choice, path: str) -> None:
  """Writes a PNG of the simulated step: one row per device, one bar per action."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  problem, sched = choice.problem, choice.schedule
  sim = schedule_lib.Simulate(sched, problem.forward, problem.backward,
                              problem.weight, problem.comm_time)
  colors = {'F': '#4c72b0', 'B': '#dd8452', 'W': '#55a868', 'BW': '#c44e52'}
  k = sched.num_devices
  fig, ax = plt.subplots(figsize=(14, 0.6 * k + 1.4))
  for d, acts in enumerate(sched.actions):
    for a in acts:
      s, e = sim.start[a], sim.end[a]
      ax.barh(k - 1 - d, e - s, left=s, height=0.8, color=colors[a.kind],
              edgecolor='black', linewidth=0.3)
      if k <= 8:
        ax.text((s + e) / 2, k - 1 - d, a.stage_label, ha='center',
                va='center', fontsize=5, color='white')
  ax.set_yticks(range(k))
  ax.set_yticklabels([f'device {d}' for d in reversed(range(k))])
  ax.set_xlabel('simulated time (s)')
  ax.set_title(f'{choice.synthesized.best.source}, K={k}, '
               f'M={sched.num_micro_batches}, V={choice.num_virtual_stages}: '
               f'step {sim.makespan:.4g} s, bubble {sim.bubble_fraction:.3f}')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


@dataclasses.dataclass(frozen=True)
class Row:
  """One K, M and budget of Table (steps in seconds, peaks in bytes)."""
  num_devices: int
  num_micro_batches: int
  budget_fraction: float
  budget: float
  one_f_one_b: tuple[float, float]  # (step, fullest device's peak).
  library: tuple[str, float, float] | None  # (name, step, peak) or None.
  synthesized: tuple[str, float, float] | None  # None: nothing fits.
  # V-Half's (step, peak) on the V = 2 split, fitting or not; None: no
  # V = 2 split (2K does not divide the layers).
  v_half: tuple[float, float] | None = None


def _Best(problems: Sequence[synthesize.Problem], budget: float, search: bool
          ) -> tuple[str, float, float] | None:
  best = None
  for problem in problems:
    try:
      found = synthesize.Synthesize(problem, budget, search)
    except synthesize.MemoryBudgetError:
      continue
    pick = found.best if search else found.best_library
    if pick and (best is None or pick.makespan < best[1] * (1 - 1e-9)):
      name = pick.source + (f' V={problem.num_virtual_stages}'
                            if problem.num_virtual_stages > 1 else '')
      best = (name, pick.makespan, max(pick.peaks))
  return best


def Table(layer: layout.LayerCost, num_layers: int, comm_time: float,
          devices: Sequence[int], micro_batches: Sequence[int],
          fractions: Sequence[float]) -> list[Row]:
  """Synthesized against library schedules for num_layers identical layers.

  At each K (dividing num_layers) and M the layers are split evenly
  into K stages (V = 1) and, where 2K divides them, 2K (V = 2); 1F1B's
  peak on its fullest device (V = 1) is the reference budget, multiplied
  by each fraction. V-Half is evaluated on the V = 2 split.

  Raises:
    plan_lib.PlanError: a K that does not divide num_layers.
  """
  rows = []
  for k in devices:
    if k < 1 or num_layers % k:
      raise plan_lib.PlanError(
          f'K = {k} devices cannot split the table\'s {num_layers} layers '
          f'evenly: pass --table_devices that divide {num_layers}.')
    for m in micro_batches:
      problems = [layout.StageProblem(
          [layer] * num_layers, [num_layers // (k * v)] * (k * v), k, m,
          comm_time=comm_time) for v in (1, 2)
                  if num_layers % (k * v) == 0]
      base = synthesize.Evaluate(problems[0],
                                 schedule_lib.Make('1f1b', k, m))
      v_half = None
      if len(problems) == 2:
        half = synthesize.Evaluate(problems[1], controllable.VHalf(k, m),
                                   'v_half')
        v_half = (half.makespan, max(half.peaks))
      for f in fractions:
        budget = f * max(base.peaks)
        rows.append(Row(k, m, f, budget, (base.makespan, max(base.peaks)),
                        _Best(problems, budget, search=False),
                        _Best(problems, budget, search=True), v_half))
  return rows


def FormatTable(rows: Sequence[Row]) -> str:
  """The rows as markdown: steps relative to 1F1B's, peaks to its peak."""
  lines = ['| K | M | budget (x 1F1B peak) | v_half (fits or not): step, '
           'peak | best library schedule that fits: step, peak | '
           'synthesized: step, peak | synthesized schedule |',
           '|---|---|---|---|---|---|---|']

  def Cell(found, digits=2):
    if found is None:
      return 'none fits'
    return (f'{found[1] / r.one_f_one_b[0]:.3f}, '
            f'{found[2] / r.one_f_one_b[1]:.{digits}f}')

  for r in rows:
    lib = ('none fits' if r.library is None else
           f'{r.library[0]} {Cell(r.library)}')
    half = '-' if r.v_half is None else Cell(('v_half',) + r.v_half, 3)
    lines.append(f'| {r.num_devices} | {r.num_micro_batches} | '
                 f'{r.budget_fraction:g} | {half} | {lib} | '
                 f'{Cell(r.synthesized)} | '
                 f'{r.synthesized[0] if r.synthesized else "-"} |')
  return '\n'.join(lines)


def Targets(rows: Sequence[Row]) -> list[str]:
  """The issue's targets, one line each, met or not."""
  at_peak = [r for r in rows if math.isclose(r.budget_fraction, 1.0)]
  worse = [r for r in at_peak if r.synthesized is None or (
      r.library is not None and r.synthesized[1] > r.library[1] * (1 + 1e-9))]
  half = [r for r in rows if math.isclose(r.budget_fraction, 0.5) and
          r.num_micro_batches >= 4 * r.num_devices]
  slow = [r for r in half if r.synthesized is None or
          r.synthesized[1] > 1.1 * r.one_f_one_b[0]]
  return [
      f'At 1F1B\'s peak, synthesized <= best library that fits: '
      f'{len(at_peak) - len(worse)} of {len(at_peak)} rows.',
      f'At half of 1F1B\'s peak with M >= 4K, within 10% of 1F1B\'s step: '
      f'{len(half) - len(slow)} of {len(half)} rows' + (
          ' (not: ' + ', '.join(f'K={r.num_devices} M={r.num_micro_batches}'
                                for r in slow) + ')' if slow else '') + '.']
