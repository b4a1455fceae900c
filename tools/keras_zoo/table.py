"""The Keras zoo's results: rows, the verdict against the float64 truth, the CSV file, and the Markdown tables (the zoo's and docs/keras.md's).

What "within float32 rounding" means (docs/keras.md): Keras's own float32
step is ``keras_error`` off the float64 truth (the model's rounding floor),
the pipeline's ``pipeline_error``; ``Verdict`` says 'exact' when the
pipeline's error is at most ``FACTOR`` times Keras's own (or below
``FLOOR``), else 'DIFFERS'. tools/keras_zoo/main.py makes the rows.
"""

from __future__ import annotations

import csv
import os
import re
from typing import Any, NamedTuple, Sequence

__all__ = ['DOCS', 'F32', 'F32_REVERSED', 'F64', 'FACTOR', 'FLOOR', 'README', 'Row', 'Errors', 'Merged',
           'ReadResults',
           'SupportTable', 'Table', 'UpdateDocs', 'UpdateReadme', 'Verdict',
           'WriteResults']

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
DOCS = os.path.join(_ROOT, 'docs', 'keras.md')
README = os.path.join(_ROOT, 'benchmarks', 'keras_zoo', 'README.md')
_BEGIN = '<!-- keras_zoo support table: python -m tools.keras_zoo --zoo_write_docs -->'
_END = '<!-- end of keras_zoo support table -->'
_README_BEGIN = ('<!-- keras_zoo results table: python -m tools.keras_zoo '
                 '--zoo_write_docs -->')
_README_END = '<!-- end of keras_zoo results table -->'
# The verdict: 'exact' when the pipeline's float32 error against the float64
# truth is at most FACTOR times Keras's own float32 error, or below FLOOR
# (8 float32 ulps of the largest gradient: where Keras is luckier than that,
# both are rounding).
FACTOR = 4.0
FLOOR = 1e-6
# Row.truth: the float64 twin's step, or (a model Keras cannot step in
# float64) Keras's float32 step over the whole batch at once.
F64 = 'float64'
F32 = 'float32 M=1'
# (a model that adds losses per micro-batch) Keras's float32 step over the
# same micro-batches, taken in reverse order.
F32_REVERSED = 'float32 reversed'


class Row(NamedTuple):
  """One zoo result: status is 'converted' or the named error's class.

  max_grad_diff: pipeline float32 vs Keras float32; keras_error and
  pipeline_error: Keras's and the pipeline's float32 gradients vs Keras's
  float64 step (None in rows from before the float64 truth). seeded_diff:
  the pipeline at the model's default dropout vs the same layers unpipelined
  under the same step seed (None: the model draws no random numbers, or a
  row from before). All relative to the largest reference gradient.
  """
  model: str
  layers: int
  k: int
  schedule: str
  status: str
  max_grad_diff: float | None
  seconds: float
  detail: str = ''
  keras_error: float | None = None
  pipeline_error: float | None = None
  seeded_diff: float | None = None
  # What keras_error and pipeline_error are measured against: F64 (the
  # float64 twin's step) or F32 (no float64 twin: Keras's float32 step over
  # the whole batch in one call; see keras_zoo.Run).
  truth: str = F64


def Errors(got: Sequence[Any], keras32: Sequence[Any], truth: Sequence[Any]
           ) -> tuple[float, float, float]:
  """(max grad diff, keras_error, pipeline_error) of gradient lists.

  Args:
    got: the pipeline's gradients, in the model's trainable_variables order.
    keras32: Keras's float32 gradients, same order.
    truth: Keras's float64 gradients, same order.

  Returns:
    The largest element difference of got vs keras32 (relative to the
    largest keras32 gradient), of keras32 vs truth and of got vs truth
    (relative to the largest truth gradient).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  def _Rel(a, b):
    diff = max(float(np.max(np.abs(np.asarray(x, np.float64) -
                                   np.asarray(y, np.float64))))
               for x, y in zip(a, b))
    return diff / max(1e-30, max(float(np.max(np.abs(y))) for y in b))

  return _Rel(got, keras32), _Rel(keras32, truth), _Rel(got, truth)


def Verdict(row: Row) -> str:
  """'exact', 'DIFFERS', or '-' (no truth, or not converted).

  The truth is Row.truth: the float64 twin's step, or for a model Keras
  cannot step in float64, Keras's float32 step over the whole batch at once
  (the same bound then holds against it).

  With randomness (seeded_diff), the pipelined and unpipelined steps under
  the same seed must agree within the same bound as the error.
  """
  if row.pipeline_error is None or row.keras_error is None:
    return '-'
  bound = max(FACTOR * row.keras_error, FLOOR)
  seeded = 0.0 if row.seeded_diff is None else row.seeded_diff
  return ('exact' if row.pipeline_error <= bound and seeded <= bound
          else 'DIFFERS')


def _E(value: float | None, truth: str = F64) -> str:
  if value is None:
    return '-'
  return f'{value:.1e}' + (' (f32)' if truth != F64 else '')


def Table(rows: Sequence[Row], seeded: bool = False) -> str:
  """The rows as a Markdown table; `seeded` adds the seeded_diff column."""
  extra = (' seeded diff |', '---|') if seeded else ('', '')
  lines = ['| model | layers | K | schedule | status | max grad diff | '
           'Keras f32 vs f64 | pipeline f32 vs f64 |' + extra[0] +
           ' verdict | s |',
           '|---|---|---|---|---|---|---|---|' + extra[1] + '---|---|']
  for r in rows:
    status = r.status if r.status == 'converted' else (
        f'{r.status}: {_Detail(r.detail)}')
    lines.append(f'| {r.model} | {r.layers} | {r.k} | {r.schedule} | '
                 f'{status} | {_E(r.max_grad_diff)} | '
                 f'{_E(r.keras_error, r.truth)} | '
                 f'{_E(r.pipeline_error, r.truth)} |' +
                 (f' {_E(r.seeded_diff)} |' if seeded else '') +
                 f' {Verdict(r)} | {r.seconds:.0f} |')
  return '\n'.join(lines) + '\n'


def _Detail(text: str) -> str:
  return re.sub(r'\s+', ' ', text)[:200].replace('|', '/')


def WriteResults(path: str, rows: Sequence[Row]) -> None:
  """Merges `rows` into the CSV file `path` (made when missing).

  A new row replaces the file's row of the same model, K and schedule (a
  re-run replaces a stale row, it does not add a second one), and a model's
  refusal before any K (K = 0, FromKeras failed) once the model has a new
  row; the other rows keep their order, the new ones come last.
  """
  new = {(r.model, r.k, r.schedule) for r in rows}
  models = {r.model for r in rows}
  kept = [r for r in (ReadResults(path) if os.path.exists(path) else [])
          if (r.model, r.k, r.schedule) not in new and
          not (r.k == 0 and r.model in models)]
  with open(path + '.tmp', 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(Row._fields)
    for r in kept + list(rows):
      w.writerow(['' if v is None else v for v in r])
  os.replace(path + '.tmp', path)


def ReadResults(path: str) -> list[Row]:
  """The rows of a results CSV (of rows of one model, K and schedule, the
  last wins, in the place of the first)."""
  def _F(value):
    return float(value) if value else None

  with open(path, newline='') as f:
    rows = [Row(d['model'], int(d['layers']), int(d['k']), d['schedule'],
                d['status'], _F(d['max_grad_diff']), float(d['seconds']),
                d['detail'], _F(d.get('keras_error')),
                _F(d.get('pipeline_error')), _F(d.get('seeded_diff')),
                d.get('truth') or F64)
            for d in csv.DictReader(f)]
  last = {}
  for r in rows:
    last[(r.model, r.k, r.schedule)] = r
  return list(last.values())


def SupportTable(rows: Sequence[Row]) -> str:
  """docs/keras.md's support table: one line per model."""
  by_model: dict[str, list[Row]] = {}
  for r in rows:
    by_model.setdefault(r.model, []).append(r)
  lines = ['| model | built as | layers | runs (K x schedule) | '
           'max grad diff | Keras f32 vs f64 | pipeline f32 vs f64 | '
           'same seeds | verdict |', '|---|---|---|---|---|---|---|---|---|']
  for name in sorted(by_model):
    rs = by_model[name]
    ok = [r for r in rs if r.status == 'converted']
    if ok:
      runs = ', '.join(f'{r.k} {r.schedule}' for r in ok)
      worst = max(ok, key=lambda r: (Verdict(r) == 'DIFFERS',
                                     r.pipeline_error or 0.0))
      verdicts = {Verdict(r) for r in ok}
      verdict = ('DIFFERS' if 'DIFFERS' in verdicts else
                 'exact' if verdicts == {'exact'} else
                 'exact where measured' if 'exact' in verdicts else '-')
      lines.append(
          f'| {name} | {ok[0].detail} | {ok[0].layers} | {runs} | '
          f'{_E(max(r.max_grad_diff for r in ok))} | '
          f'{_E(worst.keras_error, worst.truth)} | '
          f'{_E(worst.pipeline_error, worst.truth)} | '
          f'{_E(_Max(r.seeded_diff for r in ok))} | {verdict} |')
    for r in rs:
      if r.status != 'converted':
        detail = re.sub(r'\s+', ' ', r.detail)[:160].replace('|', '/')
        lines.append(f'| {name} | - | {r.layers or "-"} | {r.status} '
                     f'({r.k} {r.schedule}) | {detail} | | | | |')
  return '\n'.join(lines) + '\n'


def _Max(values: Any) -> float | None:
  values = [v for v in values if v is not None]
  return max(values) if values else None


def Merged(*results: Sequence[Row]) -> list[Row]:
  """The rows of several results files, a model's rows taken from the last
  file that has it (keras_hub.csv's GPT-2 replaces results.csv's)."""
  owner = {}
  for i, rows in enumerate(results):
    for r in rows:
      owner[r.model] = i
  return [r for i, rows in enumerate(results) for r in rows
          if owner[r.model] == i]


def UpdateDocs(text: str, rows: Sequence[Row]) -> str:
  """`text` (docs/keras.md) with its support table made from `rows`."""
  begin, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
  return text[:begin] + '\n' + SupportTable(rows) + text[end:]


def UpdateReadme(text: str, rows: Sequence[Row],
                 results: str = 'results.csv') -> str:
  """`text` (benchmarks/keras_zoo/README.md) with the table of the rows of
  results file `results` (its base name) in its section: results.csv's
  (no seeded column), or the one marked with that name (keras_hub.csv's)."""
  if results == 'results.csv':
    begin_mark, end_mark, seeded = _README_BEGIN, _README_END, False
  else:
    begin_mark = f'<!-- keras_zoo results table {results} -->'
    end_mark = f'<!-- end of keras_zoo results table {results} -->'
    seeded = True
  begin = text.index(begin_mark) + len(begin_mark)
  return (text[:begin] + '\n' + Table(rows, seeded) +
          text[text.index(end_mark):])
