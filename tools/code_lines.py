"""Code lines of the engine's TensorFlow half (or any modules), at one or more git revisions.

A code line is a line that holds a token of code: blank lines, comments and
docstrings (a string that is a whole statement) are not counted, so the
count follows what a reader has to understand, not how much is explained::

  python -m tools.code_lines                       # the working tree
  python -m tools.code_lines --revs=bf702b5,HEAD   # side by side

The default modules are the engine's TensorFlow half (docs/pipeline.md):
engine, interpreter, tick_graph, cell_program, slots, tensor_loop,
graph_edit, leaves and tf_internals under gpipe_tf/pipeline/ (transfers.py,
the processes mode's bytes-sent reading, is a tool's helper and left out, as
is introspect.py, the tools' API, which reads a built step and builds
nothing).
A module missing at a revision counts 0. benchmarks/code_lines has the
table of record.
"""

from __future__ import annotations

import io
import os
import subprocess
import tokenize
from typing import Sequence

from absl import app
from absl import flags

__all__ = ['ENGINE', 'CodeLines', 'Source']

ENGINE = tuple(f'gpipe_tf/pipeline/{name}.py' for name in (
    'engine', 'interpreter', 'tick_graph', 'cell_program', 'slots',
    'tensor_loop', 'graph_edit', 'leaves', 'tf_internals'))

_SKIPPED = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENDMARKER)


def CodeLines(source: str) -> int:
  """The lines of `source` (Python) that hold a token of code."""
  tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  lines = set()
  before = None  # The latest token that is code or ends a statement.
  for i, tok in enumerate(tokens):
    if tok.type == tokenize.STRING and (
        before is None or before.type == tokenize.NEWLINE or
        before.string == ':') and tokens[i + 1].type == tokenize.NEWLINE:
      continue  # A docstring (or any string standing alone).
    if tok.type == tokenize.NEWLINE or tok.type not in _SKIPPED:
      before = tok
    if tok.type not in _SKIPPED:
      lines.update(range(tok.start[0], tok.end[0] + 1))
  return len(lines)


def Source(path: str, rev: str | None = None) -> str | None:
  """The file at `path` in the working tree (rev None) or at git revision
  `rev`; None where it does not exist."""
  if rev is None:
    if not os.path.exists(path):
      return None
    with open(path, encoding='utf-8') as f:
      return f.read()
  done = subprocess.run(['git', 'show', f'{rev}:{path}'],
                        capture_output=True, text=True, check=False)
  return done.stdout if done.returncode == 0 else None


_REVS = flags.DEFINE_list(
    'revs', [], 'Git revisions to count at, side by side (default: the '
    'working tree).')
_PATHS = flags.DEFINE_list('paths', list(ENGINE),
                           'The modules to count, relative to the repository.')


def _Table(paths: Sequence[str], revs: Sequence[str | None]) -> str:
  names = [r or 'working tree' for r in revs]
  out = ['| module | ' + ' | '.join(names) + ' |',
         '|---|' + '---|' * len(revs)]
  totals = [0] * len(revs)
  for path in paths:
    counts = []
    for k, rev in enumerate(revs):
      source = Source(path, rev)
      n = 0 if source is None else CodeLines(source)
      totals[k] += n
      counts.append(str(n))
    out.append(f'| {os.path.basename(path)} | ' + ' | '.join(counts) + ' |')
  out.append('| total | ' + ' | '.join(f'{t:,}' for t in totals) + ' |')
  return '\n'.join(out)


def main(argv: Sequence[str]) -> None:
  del argv
  print(_Table(_PATHS.value, _REVS.value or [None]))


if __name__ == '__main__':
  app.run(main)
