"""The parent of local_workers_test's orphan check: starts 2 local workers, prints their pids, waits to be killed.

Run as ``python tests/runtime/local_workers_parent.py`` from the repository
root; prints one line ``pids 123 456`` once both serve, then sleeps. The
test kills this process with SIGKILL (no Python cleanup runs) and checks
that the workers die with it.
"""

import time

from gpipe_tf.runtime import local_workers


def main() -> None:
  with local_workers.LocalWorkers(local_workers.Options(num_workers=2)) as w:
    print('pids', *w.pids, flush=True)
    while True:
      time.sleep(1)


if __name__ == '__main__':
  main()
