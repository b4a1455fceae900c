"""What the engine runs: every (path, schedule) pair and the features each runs with, in one place.

The interpreter runs every schedule the same way, so support is decided by
meaning alone: training through a GradientTape around ``FProp`` computes the
loss after the last forward, which only a fill-drain schedule (every forward
before any backward on each device) can wait for; every other pair runs with
every feature. ``tests/pipeline/support_test.py`` checks each supported pair
against SequentialLayer with all the features at once, checks each refusal
raises, and that docs/support.md (written by ``python -m tools.support_doc``)
shows ``Markdown()``.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from gpipe_tf.pipeline.schedule import table

__all__ = ['FEATURES', 'Markdown', 'PATHS', 'Refusal']

PATHS = {
    'tape': 'FProp(training=True) under a GradientTape',
    'loss inside': 'ComputeLossAndGradients (the tasks and the trainer)',
    'inference': "FProp(training=False) (inference and the trainer's eval)",
}

FEATURES = (
    "remat 'never', 'except_last' and 'always'",
    "execution 'loop' (built whole, folded, and as one switch loop) and "
    "'unrolled'",
    'BatchNorm with batch statistics (per micro-batch) and with moving '
    'averages in training',
    'dropout (masks repeat in the recompute)',
    'sparse gradients (IndexedSlices from embeddings)',
    'layers passing tuples',
    'skips (stash/pop) to the next cell and across cells',
    'uneven micro-batches (N not divisible by M)',
    'a variable used by two layers of one cell, by two cells, and in the '
    'loss',
    'the per-action trace (trace.ScheduleTrace)',
)


def Refusal(path: str, schedule: table.Schedule) -> str | None:
  """Why `path` cannot run `schedule` (None: it runs, with every feature).

  Raises:
    ValueError: an unknown path.
  """
  if path not in PATHS:
    raise ValueError(f'path must be one of {sorted(PATHS)}, got {path!r}')
  if path == 'tape' and not schedule.IsFillDrain():
    return ('the loss exists only after every forward, and this schedule '
            'runs backwards before its last forward: use ComputeLossAndGradients')
  return None


def Markdown(schedules: list[table.Schedule]) -> str:
  """The support matrix as a Markdown table, one row per schedule."""
  lines = ['| schedule | ' + ' | '.join(PATHS) + ' |',
           '|---' * (1 + len(PATHS)) + '|']
  for sched in schedules:
    cells = []
    for path in PATHS:
      reason = Refusal(path, sched)
      cells.append('yes' if reason is None else 'refused: ' + reason)
    lines.append(f'| {sched.name} (V={sched.num_virtual_stages}) | ' +
                 ' | '.join(cells) + ' |')
  lines.append('')
  lines.append('Every "yes" runs with every one of: ' + '; '.join(FEATURES) +
               '.')
  return '\n'.join(lines)
