"""Tests of tools/trace/tracing_parts.py: each part's seconds counted once, functions restored."""

import sys
import types
import unittest
from unittest import mock

from tools.trace import tracing_parts


class _Clock:
  """A clock that moves only when told."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _FakeModule(clock):
  module = types.ModuleType('fake_engine')

  class Program:

    def __init__(self):
      clock.now += 1.0
      module.Specs()  # Called through the module, as the engine does.
      clock.now += 3.0

  def Specs():
    clock.now += 2.0

  module.Program = Program
  module.Specs = Specs
  return module


class TracingPartsTest(unittest.TestCase):

  def testEachPartCountsItsOwnSecondsOnce(self):
    clock = _Clock()
    module = _FakeModule(clock)
    specs, init = module.Specs, module.Program.__init__
    parts = (('specs', 'fake_engine', 'Specs'),
             ('programs', 'fake_engine', 'Program.__init__'),
             ('absent', 'fake_engine', 'Missing'),
             ('no module', 'no_such_module_here', 'F'))
    with mock.patch.dict(sys.modules, fake_engine=module), \
        mock.patch.object(tracing_parts.time, 'perf_counter', clock):
      with tracing_parts.Parts(parts) as counted:
        module.Program()
        module.Specs()
    # Program: 1 + 3 of its own, its call of Specs apart; Specs: 2 + 2.
    self.assertEqual(counted.seconds, {'specs': 4.0, 'programs': 4.0,
                                       'absent': 0.0, 'no module': 0.0})
    self.assertIs(module.Specs, specs)
    self.assertIs(module.Program.__init__, init)

  def testTheEnginesPartsExist(self):
    # Every wrapped function but a legacy one is where PARTS says in this
    # tree (an older tree may lack one; this one may not).
    import importlib  # pylint: disable=g-import-not-at-top
    for name, module, path in tracing_parts.PARTS:
      if name in tracing_parts.LEGACY:
        continue
      owner = importlib.import_module(module)
      for attr in path.split('.'):
        owner = getattr(owner, attr)
      self.assertTrue(callable(owner), name)


if __name__ == '__main__':
  unittest.main()
