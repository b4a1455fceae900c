"""Dump, DumpTorch and Load: a schedule as CSV, for hand-written or tool-made schedules.

Load reads two formats and tells them apart by themselves: gpipe_tf's own,
below, and the compute-only CSV of PyTorch's torch.distributed.pipelining
(torch_csv.py: one line of actions like 0F1,1B0 per device). Dump writes the
first, DumpTorch the second.

gpipe_tf's format, one row per action, e.g. 1F1B with K = 2, M = 2:

    # gpipe_tf schedule num_devices=2 num_micro_batches=2 stage_devices=0;1 name=1f1b
    device,step,action,stage,micro_batch
    0,0,F,0,0
    0,1,F,0,1
    0,2,BW,0,0
    ...

step is the action's 0-based position in its device's list (rows may come in
any order). action is F, B, W or BW. Lines starting with '#' are comments;
Dump writes the one above so that Load(Dump(s)) == s exactly. Without it, Load
takes M = 1 + the largest micro_batch, K = 1 + the largest device and each
stage's device from its rows.
"""

from collections.abc import Iterator
import contextlib
import csv
import os
from typing import IO

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import torch_csv

__all__ = ['Dump', 'DumpTorch', 'Load']

Action = action_lib.Action
ScheduleError = action_lib.ScheduleError

HEADER = ('device', 'step', 'action', 'stage', 'micro_batch')
_MAGIC = '# gpipe_tf schedule'

PathOrFile = str | os.PathLike | IO[str]


@contextlib.contextmanager
def _Opened(f: PathOrFile, mode: str) -> Iterator[IO[str]]:
  if isinstance(f, (str, os.PathLike)):
    with open(f, mode, newline='', encoding='utf-8') as opened:
      yield opened
  else:
    yield f


def Dump(schedule: table.Schedule, f: PathOrFile) -> None:
  """Writes a schedule as CSV (format in the module docstring).

  Args:
    schedule: the schedule; it need not be valid.
    f: a path, or a text file object (left open).
  """
  stage_devices = ';'.join(str(d) for d in schedule.stage_devices)
  with _Opened(f, 'w') as out:
    out.write(f'{_MAGIC} num_devices={schedule.num_devices} '
              f'num_micro_batches={schedule.num_micro_batches} '
              f'stage_devices={stage_devices} name={schedule.name}\n')
    writer = csv.writer(out, lineterminator='\n')
    writer.writerow(HEADER)
    for d, acts in enumerate(schedule.actions):
      for i, act in enumerate(acts):
        writer.writerow([d, i, act.kind, act.stage, act.micro_batch])


def DumpTorch(schedule: table.Schedule, f: PathOrFile) -> None:
  """Writes a schedule in PyTorch's compute-only CSV (see torch_csv.py).

  One line of actions per device, e.g. '0F0,0F1,0B0,0B1' (PyTorch's B is our
  BW, its I our B). Load reads it back with the same actions, micro-batches
  and placement; the name is not kept.

  Args:
    schedule: the schedule; it need not be valid.
    f: a path, or a text file object (left open).
  """
  with _Opened(f, 'w') as out:
    out.write(torch_csv.Format(schedule))


def _ParseMeta(text: str, line: int) -> dict:
  """Parses 'num_devices=K num_micro_batches=M stage_devices=0;1 name=...'."""
  text, _, name = text.partition(' name=')
  meta = {'name': name.strip() or 'custom'}
  try:
    for item in text.split():
      key, value = item.split('=')
      if key == 'stage_devices':
        meta[key] = [int(v) for v in value.split(';')]
      elif key in ('num_devices', 'num_micro_batches'):
        meta[key] = int(value)
      else:
        raise ValueError(f'unknown key {key!r}')
  except ValueError as e:
    raise ScheduleError(f'line {line}: bad {_MAGIC!r} comment ({e}); expected '
                        "e.g. 'num_devices=2 num_micro_batches=4 "
                        "stage_devices=0;1 name=custom'") from None
  return meta


def _ParseRow(fields: list[str], line: int) -> tuple[int, int, Action]:
  if len(fields) != len(HEADER):
    raise ScheduleError(f'line {line}: expected {len(HEADER)} fields '
                        f'({",".join(HEADER)}), got {len(fields)}: {fields}')
  device, step, kind, stage, micro_batch = (v.strip() for v in fields)
  try:
    numbers = [int(v) for v in (device, step, stage, micro_batch)]
    if min(numbers) < 0:
      raise ValueError('negative')
  except ValueError:
    raise ScheduleError(f'line {line}: device, step, stage and micro_batch must '
                        f'be ints >= 0, got {fields}') from None
  if kind not in action_lib.KINDS:
    raise ScheduleError(f'line {line}: action must be one of '
                        f'{", ".join(action_lib.KINDS)}, got {kind!r}')
  return numbers[0], numbers[1], Action(kind, numbers[2], numbers[3])


def Load(f: PathOrFile) -> table.Schedule:
  """Reads and validates a schedule written by Dump, DumpTorch, PyTorch or by hand.

  The format is recognised from the text (torch_csv.LooksLikeTorch): a file
  with a '# gpipe_tf schedule' comment or a 'device,step,...' header is
  gpipe_tf's, one whose first row holds cells like 0F0 is PyTorch's.

  Args:
    f: a path, or a text file object.

  Returns:
    The validated Schedule.

  Raises:
    ScheduleError: naming the line of the first malformed row (wrong field
      count, a non-int, an unknown action, a repeated step, a stage found on
      two devices) or, if the schedule is invalid, the line of its first bad
      step (see Schedule.Validate); in PyTorch's format also the column (see
      torch_csv.Parse).
  """
  with _Opened(f, 'r') as src:
    lines = src.read().splitlines()
  if torch_csv.LooksLikeTorch(lines):
    return torch_csv.Parse(lines)
  meta, header_seen, steps, stage_rows = {}, False, {}, {}
  for number, text in enumerate(lines, start=1):
    if text.startswith(_MAGIC):
      meta = _ParseMeta(text[len(_MAGIC):], number)
    if not text.strip() or text.startswith('#'):
      continue
    fields = next(csv.reader([text]))
    if not header_seen:
      if tuple(v.strip() for v in fields) != HEADER:
        raise ScheduleError(f'line {number}: expected the header '
                            f'{",".join(HEADER)!r}, got {text!r} (or, for '
                            "PyTorch's format, rows of cells like 0F0,0B0)")
      header_seen = True
      continue
    device, step, act = _ParseRow(fields, number)
    if step in steps.setdefault(device, {}):
      raise ScheduleError(f'line {number}: device {device} step {step} is already '
                          f'given at line {steps[device][step][1]}')
    steps[device][step] = (act, number)
    first = stage_rows.setdefault(act.stage, (device, number))
    if 'stage_devices' not in meta and first[0] != device:
      raise ScheduleError(f'line {number}: stage {act.stage} is on device {device} '
                          f'here but on device {first[0]} at line {first[1]}; '
                          'a stage runs on one device')
  if not steps:
    raise ScheduleError('the schedule file has no action rows')
  num_devices = max(meta.get('num_devices', 0), 1 + max(steps))
  rows, row_lines = [], []
  for d in range(num_devices):
    given = steps.get(d, {})
    for i, step in enumerate(sorted(given)):
      if step != i:
        raise ScheduleError(f'line {given[step][1]}: device {d} step {step} '
                            f'follows step {i - 1}; steps must run 0, 1, 2, ...')
    rows.append([given[i][0] for i in range(len(given))])
    row_lines.append([given[i][1] for i in range(len(given))])
  stage_devices = meta.get('stage_devices')
  if stage_devices is None:
    for s in range(1 + max(stage_rows)):
      if s not in stage_rows:
        raise ScheduleError(f'stage {s} has no rows, so its device is unknown; '
                            f'add a {_MAGIC!r} comment with stage_devices=')
    stage_devices = [stage_rows[s][0] for s in range(len(stage_rows))]
  num_micro_batches = meta.get(
      'num_micro_batches',
      1 + max(a.micro_batch for acts in rows for a in acts))
  schedule = table.Schedule(rows, num_micro_batches, stage_devices,
                            name=meta.get('name', 'custom'))
  try:
    schedule.Validate()
  except ScheduleError as e:
    if e.device is None or e.position is None:
      raise
    line = row_lines[e.device][e.position]
    raise ScheduleError(f'line {line}: {e}', e.device, e.position) from e
  return schedule
