"""Draws a per-device grid of cells as text: the one ASCII renderer of schedules, tick programs and traces.

One row per device, one cell per column, every cell padded to the widest::

    dev 0: F0  F1  ..  BW0 BW0
    dev 1: ..  F0  BW0 BW0 ..

The callers decide what a column is (a unit-time tick of a schedule, a tick
of a tick program, a slice of measured time in a trace) and what a cell says;
this module only lays the text out.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ['Grid', 'IDLE']

IDLE = '..'


def Grid(rows: Sequence[Sequence[str | None]], idle: str = IDLE,
         separator: str = ' ') -> str:
  """Lays out rows of cells, 'dev d: ' before row d.

  Args:
    rows: rows[d][t], the text of device d's cell in column t; None is idle.
    idle: the text of an idle cell.
    separator: put between cells (a chart of one character per column
      passes '').

  Returns:
    One line per row: every cell left-aligned to the widest cell (and at
    least as wide as ``idle``), device numbers right-aligned, trailing
    blanks stripped.
  """
  cells = [[idle if c is None else c for c in row] for row in rows]
  width = max([len(idle)] + [len(c) for row in cells for c in row])
  digits = len(str(max(len(rows) - 1, 0)))
  return '\n'.join(
      f'dev {d:>{digits}}: ' + separator.join(c.ljust(width)
                                              for c in row).rstrip()
      for d, row in enumerate(cells))
