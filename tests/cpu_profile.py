"""A pytest plugin that records each test's CPU seconds, and a summary of them by file.

The suite is CPU-bound on CI's 2 cores (docs/testing.md), so what a test costs
is its CPU time, not its wall time, which the other xdist process and anything
else on the machine stretch. With this plugin every pytest process writes, per
test (its class's setUpClass included in its first test), the CPU seconds of
the process itself (all its threads), those of the subprocesses it waited for,
and the wall seconds::

    python -m pytest -q -n 2 --dist loadgroup -p cpu_profile --cpu_profile=/tmp/cpu
    python tests/cpu_profile.py /tmp/cpu            # seconds by file, largest first
    python tests/cpu_profile.py /tmp/cpu --tests    # by test

Each process writes <dir>/<worker>.tsv (worker: gw0, gw1, or main without
xdist): self CPU, children CPU, wall, test id, tab-separated.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time

import pytest

_ROWS: list[tuple[float, float, float, str]] = []


def pytest_addoption(parser):
  parser.addoption('--cpu_profile', default=None, metavar='DIR',
                   help='Write each test\'s CPU seconds to DIR/<worker>.tsv '
                   '(tests/cpu_profile.py).')


def _Cpu() -> tuple[float, float]:
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime,
          children.ru_utime + children.ru_stime)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  own, children = _Cpu()
  start = time.time()
  yield
  own_after, children_after = _Cpu()
  _ROWS.append((own_after - own, children_after - children,
                time.time() - start, item.nodeid))


def pytest_sessionfinish(session):
  out = session.config.getoption('cpu_profile')
  if not out or not _ROWS:
    return
  os.makedirs(out, exist_ok=True)
  worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
  with open(os.path.join(out, worker + '.tsv'), 'w') as f:
    for row in _ROWS:
      f.write('%.2f\t%.2f\t%.2f\t%s\n' % row)


def Summary(directory: str, by_test: bool = False) -> list[str]:
  """Lines 'cpu children wall id', by file (or test), largest CPU first,
  then the total."""
  sums = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
  for name in sorted(os.listdir(directory)):
    if not name.endswith('.tsv'):
      continue
    with open(os.path.join(directory, name)) as f:
      for line in f:
        own, children, wall, nodeid = line.rstrip('\n').split('\t', 3)
        key = nodeid if by_test else nodeid.split('::')[0]
        total = sums[key]
        total[0] += float(own) + float(children)
        total[1] += float(children)
        total[2] += float(wall)
  rows = sorted(sums.items(), key=lambda kv: -kv[1][0])
  lines = ['%8.1f %8.1f %8.1f  %s' % (*v, k) for k, v in rows]
  total = [sum(v[i] for v in sums.values()) for i in range(3)]
  lines.append('%8.1f %8.1f %8.1f  total (cpu, of it in subprocesses, wall)'
               % tuple(total))
  return lines


if __name__ == '__main__':
  if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ['--tests']):
    sys.exit('usage: python tests/cpu_profile.py DIR [--tests]')
  print('\n'.join(Summary(sys.argv[1], by_test=sys.argv[2:] == ['--tests'])))
