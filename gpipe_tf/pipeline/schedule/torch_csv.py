"""Parse and Format: schedules in the compute-only CSV of PyTorch's torch.distributed.pipelining.

PyTorch's pipeline schedules write their per-rank action lists as CSV
(PipelineScheduleMulti._dump_csv) and read them back (_load_csv). The file
has no header; line r is rank (device) r's list, in order, one action per
cell. 1F1B with K = 2 devices and M = 2 micro-batches:

    0F0,0F1,,0B0,,0B1
    ,1F0,1B0,1F1,1B1

A cell is one of

    {s}F{m}              forward of stage s, micro-batch m     -> F(s, m)
    {s}I{m}              input gradient                         -> B(s, m)
    {s}W{m}              weight gradient                        -> W(s, m)
    {s}B{m}              FULL backward                          -> BW(s, m)
    (a;b)OVERLAP_F_B     a then b, back to back                 -> a, b
    (empty)              an idle slot                           -> skipped

Mind the letters: PyTorch's B is the whole backward (our BW) and its I is our
B. Each stage runs on the device whose line names it, so any placement
reads, the V-shaped one of 'zbv' included (rank 0 holding stages 0 and
2K-1). M = 1 + the largest micro-batch. An empty line between rows is a
device with no actions (as PyTorch reads it); empty lines at the end are
ignored, and lines starting with '#' are comments (not PyTorch's, but handy
in a file written by hand). Communication and FSDP actions (SEND_F, RECV_B,
UNSHARD, ...) are not part of the compute-only format and are refused.

Load() in csv_io.py recognises this format and calls Parse(); DumpTorch()
there writes Format().
"""

from collections.abc import Sequence
import csv
import re

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table

__all__ = ['Format', 'LooksLikeTorch', 'Parse']

Action = action_lib.Action
ScheduleError = action_lib.ScheduleError

# PyTorch's compute letters and ours.
_FROM_TORCH = {'F': action_lib.F, 'I': action_lib.B, 'W': action_lib.W,
               'B': action_lib.BW}
_TO_TORCH = {ours: theirs for theirs, ours in _FROM_TORCH.items()}
_OVERLAP = 'OVERLAP_F_B'
_NOT_COMPUTE = ('UNSHARD', 'RESHARD', 'REDUCE_GRAD', 'SEND_F', 'RECV_F',
                'SEND_B', 'RECV_B')

_ACTION = re.compile(r'(\d+)([FIWB])(\d+)')
_NO_MICRO_BATCH = re.compile(r'(\d+)([FIWB])')
_OTHER_KIND = re.compile(r'\d+(' + '|'.join(_NOT_COMPUTE) + r')\d*')
_GROUP = re.compile(r'\((.*)\)(\w*)')


def LooksLikeTorch(lines: Sequence[str]) -> bool:
  """True when a CSV's lines read as PyTorch's format rather than gpipe_tf's.

  gpipe_tf's format (csv_io.py) has a '# gpipe_tf schedule' comment or starts
  with the header 'device,step,action,...'. PyTorch's has neither: every
  filled cell of its first row starts with a stage number or '('.
  """
  for text in lines:
    if text.startswith('# gpipe_tf schedule'):
      return False
  for text in lines:
    if not text.strip() or text.startswith('#'):
      continue
    cells = [c.strip() for c in next(csv.reader([text]))]
    return all(c[:1].isdigit() or c.startswith('(') for c in cells if c)
  return False


def _Where(line: int, column: int) -> str:
  return f'line {line}, column {column}'


def _ParseAction(cell: str, line: int, column: int) -> Action:
  """One '{stage}{F|I|W|B}{micro_batch}' cell (or part of an OVERLAP_F_B)."""
  match = _ACTION.fullmatch(cell)
  if match:
    stage, kind, micro_batch = match.groups()
    return Action(_FROM_TORCH[kind], int(stage), int(micro_batch))
  where = _Where(line, column)
  if _NO_MICRO_BATCH.fullmatch(cell):
    raise ScheduleError(f'{where}: {cell!r} has no micro-batch; write e.g. '
                        f'{cell}0 for micro-batch 0')
  if _OTHER_KIND.fullmatch(cell):
    raise ScheduleError(
        f'{where}: {cell!r} is a communication or FSDP action; this reader '
        'takes the compute-only format (F, I, W, B and OVERLAP_F_B): dump the '
        'schedule before its communication is added, or delete the cell')
  raise ScheduleError(
      f'{where}: {cell!r} is not an action; write {{stage}}{{kind}}'
      '{micro_batch} with kind F (forward), I (input gradient), W (weight '
      'gradient) or B (full backward), e.g. 2F0, or (a;b)OVERLAP_F_B, or leave '
      'the cell empty for an idle slot')


def _ParseCell(cell: str, line: int, column: int) -> list[Action]:
  """A cell's actions in order: none, one, or the parts of an OVERLAP_F_B."""
  cell = cell.strip()
  if not cell:
    return []
  group = _GROUP.fullmatch(cell)
  if not group:
    return [_ParseAction(cell, line, column)]
  inner, kind = group.groups()
  if kind != _OVERLAP:
    raise ScheduleError(f'{_Where(line, column)}: {cell!r} is not an action '
                        f'group; the only group is (a;b){_OVERLAP}, e.g. '
                        f'(0F1;1B0){_OVERLAP}')
  parts = [p.strip() for p in inner.split(';')]
  if len(parts) < 2 or not all(parts):
    raise ScheduleError(f'{_Where(line, column)}: {cell!r} must hold two or '
                        f'more actions separated by ";", e.g. '
                        f'(0F1;1B0){_OVERLAP}')
  return [_ParseAction(p, line, column) for p in parts]


def Parse(lines: Sequence[str]) -> table.Schedule:
  """Reads and validates a schedule from the lines of a PyTorch-format CSV.

  Args:
    lines: the file's lines (without line ends), e.g. text.splitlines().

  Returns:
    The validated Schedule: one device per row, each stage on the device of
    the row that names it, M = 1 + the largest micro-batch, name 'custom'.

  Raises:
    ScheduleError: naming the line and column of the first malformed cell, of
      a stage found on two rows, or (if the schedule is invalid, see
      Schedule.Validate) of its first bad step; or if no cell holds an action
      or a stage number is skipped.
  """
  rows, cells = [], []  # cells[d][i]: (line, column) of rows[d][i].
  placed = {}  # stage -> (device, line, column) where first seen.
  numbered = [(n, text) for n, text in enumerate(lines, start=1)
              if not text.startswith('#')]
  while numbered and not numbered[-1][1].strip():
    numbered.pop()
  for device, (line, text) in enumerate(numbered):
    rows.append([])
    cells.append([])
    for column, cell in enumerate(next(csv.reader([text]), []), start=1):
      for act in _ParseCell(cell, line, column):
        first = placed.setdefault(act.stage, (device, line, column))
        if first[0] != device:
          raise ScheduleError(
              f'{_Where(line, column)}: stage {act.stage} is on this row '
              f'(device {device}) but also on line {first[1]} (device '
              f'{first[0]}), column {first[2]}; a stage runs on one device: '
              'move its actions to one row')
        rows[-1].append(act)
        cells[-1].append((line, column))
  if not placed:
    raise ScheduleError('the PyTorch-format schedule has no actions; write one '
                        'row per device with cells like 0F0,0B0')
  missing = [s for s in range(max(placed)) if s not in placed]
  if missing:
    raise ScheduleError(f'stage {missing[0]} appears in no cell, so its device '
                        f'is unknown; stages must be numbered 0 to '
                        f'{max(placed)} without gaps')
  num_micro_batches = 1 + max(a.micro_batch for acts in rows for a in acts)
  schedule = table.Schedule(rows, num_micro_batches,
                            [placed[s][0] for s in range(len(placed))])
  try:
    schedule.Validate()
  except ScheduleError as e:
    if e.device is None or e.position is None:
      raise
    line, column = cells[e.device][e.position]
    raise ScheduleError(f'{_Where(line, column)}: {e}', e.device,
                        e.position) from e
  return schedule


def Format(schedule: table.Schedule) -> str:
  """Writes a schedule in PyTorch's format (see the module docstring).

  One line per device, its actions in order, no idle cells (the format's time
  is the order; Schedule.Clocks() has the ticks) and no OVERLAP_F_B groups.
  Parse(Format(s).splitlines()) == s for every valid schedule whose last
  device has actions; the name is not kept.
  """
  return ''.join(
      ','.join(f'{a.stage}{_TO_TORCH[a.kind]}{a.micro_batch}' for a in acts) +
      '\n' for acts in schedule.actions)
