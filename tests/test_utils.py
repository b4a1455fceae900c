"""Shared test set-up (logical CPU devices standing in for accelerators) and input-reading helpers."""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpipe_tf import devices  # pylint: disable=g-import-not-at-top

# Every test process splits the CPU into this many logical devices, once,
# before any op runs (conftest.py under pytest; module import otherwise).
NUM_TEST_DEVICES = 4


def SetUpDevices() -> list:
  return devices.SplitCpu(NUM_TEST_DEVICES)


def Batches(generator, num, skip=0):
  """The first `num` batches of GetDataset(skip) as dicts of numpy arrays."""
  return list(generator.GetDataset(skip_batches=skip).take(num)
              .as_numpy_iterator())


def RaisesWithin(seconds, fn):
  """Runs fn in a daemon thread; returns its exception, fails on a hang."""
  outcome = {}

  def _Run():
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=_Run, daemon=True)
  thread.start()
  thread.join(seconds)
  if thread.is_alive():
    raise AssertionError(f'Call did not return within {seconds} s.')
  return outcome.get('error')
