"""A tool's absl entry point run in-process as its own process would run it, for child scripts that check several cases.

A child process costs about 8 s of CPU to import TensorFlow, a case of a CLI
check a fraction of a second: a test's child script runs every case but the
last through `RunCapturingStderr` and ends with the last one (whose stderr and
exit status are then the process's own). The child needs `tests/` on its
PYTHONPATH (`test_utils.CHILD_PYTHONPATH`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from typing import Callable, Sequence

from absl import app
from absl import flags


def RunCapturingStderr(main: Callable[[Sequence[str]], None],
                       argv: Sequence[str]) -> tuple[int, str]:
  """(exit status, everything written to file descriptor 2) of
  `app.run(main, argv)`, with flags unparsed first.

  Its end is what the interpreter makes of it: a SystemExit's code (a string
  is printed on stderr, status 1), an uncaught exception's traceback on
  stderr and status 1. Descriptor 2, not sys.stderr: TensorFlow's and absl's
  C++ logging write there too.
  """
  flags.FLAGS.unparse_flags()
  with tempfile.TemporaryFile('w+') as err:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)
    try:
      app.run(main, argv=list(argv))
      status = 0
    except SystemExit as e:
      status = e.code
      if isinstance(status, str):
        print(status, file=sys.stderr)
        status = 1
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
      status = 1
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
    err.seek(0)
    return status or 0, err.read()
