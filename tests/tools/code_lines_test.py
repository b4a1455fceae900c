"""Tests of tools/code_lines.py: what counts as a line of code."""

import os
import unittest

from tools import code_lines

_SOURCE = '''"""Module docstring,
over two lines."""

import os  # A comment after code counts once.

# A comment alone.

NAME = 'a string assigned is code'


def F(x,
      y):
  """A docstring."""
  return (x +
          y)


class C:
  """Class docstring."""

  def G(self):
    """Method docstring."""
    return f"""a string
    returned over two lines"""
'''


class CodeLinesTest(unittest.TestCase):

  def testCodeIsCountedAndDocstringsCommentsAndBlanksAreNot(self):
    # import, NAME, def (2 lines), return (2), class, def G, return (2).
    self.assertEqual(code_lines.CodeLines(_SOURCE), 10)

  def testEmptySource(self):
    self.assertEqual(code_lines.CodeLines(''), 0)

  def testEveryEngineModuleExistsInTheWorkingTree(self):
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    for path in code_lines.ENGINE:
      self.assertTrue(os.path.exists(os.path.join(root, path)), path)
