"""Shared test set-up: logical CPU devices standing in for accelerators."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpipe_tf import devices  # pylint: disable=g-import-not-at-top

# Every test process splits the CPU into this many logical devices, once,
# before any op runs (conftest.py under pytest; module import otherwise).
NUM_TEST_DEVICES = 4


def SetUpDevices() -> list:
  return devices.SplitCpu(NUM_TEST_DEVICES)
