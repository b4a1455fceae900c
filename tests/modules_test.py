"""Every module of gpipe_tf/ and tools/ declares its public names in ``__all__``, each of which it defines."""

import ast
import importlib
import os

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = ('gpipe_tf', 'tools')


def _Modules():
  """(path relative to the repository, source) of every module."""
  for package in _PACKAGES:
    for folder, _, files in os.walk(os.path.join(_ROOT, package)):
      for name in sorted(files):
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          with open(path, encoding='utf-8') as f:
            yield os.path.relpath(path, _ROOT), f.read()


def _Bound(statements):
  """The names a module's top-level statements bind (if/try bodies too)."""
  names = set()
  for node in statements:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split('.')[0] for a in node.names)
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for target in targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.If, ast.Try)):
      names |= _Bound(node.body + node.orelse +
                      getattr(node, 'finalbody', []) +
                      [s for h in getattr(node, 'handlers', []) for s in h.body])
  return names


def _All(tree, path):
  """The list ``__all__`` names, or None when the module has none.

  A literal is read from the source; anything else (a lazy package that
  computes it) from the imported module.
  """
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and
        isinstance(node.targets[0], ast.Name) and
        node.targets[0].id == '__all__'):
      try:
        return list(ast.literal_eval(node.value))
      except ValueError:
        return list(_Import(path).__all__)
  return None


def _Import(path):
  name = path[:-len('.py')].replace(os.sep, '.')
  return importlib.import_module(name.removesuffix('.__init__'))


def Problems(path, source):
  """What is wrong with a module's ``__all__``: a list of messages."""
  tree = ast.parse(source, path)
  names = _All(tree, path)
  if names is None:
    return [f'{path} has no __all__: list its public names (an internal '
            'module: __all__ = [])']
  problems = []
  bound = _Bound(tree.body)
  lazy = '__getattr__' in bound  # Names resolved on first use (PEP 562).
  for name in names:
    if name not in bound and not (lazy and hasattr(_Import(path), name)):
      problems.append(f'{path}: __all__ names {name!r}, which it does not '
                      'define: define it or drop it from __all__')
    if name.startswith('_'):
      problems.append(f'{path}: __all__ names the private {name!r}')
  if len(set(names)) != len(names):
    problems.append(f'{path}: __all__ names some names twice')
  return problems


class AllTest(absltest.TestCase):

  def testEveryModuleListsOnlyNamesItDefines(self):
    modules = list(_Modules())
    self.assertGreater(len(modules), 80)
    problems = [p for path, source in modules for p in Problems(path, source)]
    self.assertEqual(problems, [], '\n'.join(problems))

  def testAMissingNameOrAMissingAllFails(self):
    self.assertEqual(Problems('m.py', "__all__ = ['F']\ndef F(): pass\n"), [])
    self.assertEqual(Problems('m.py', "from x import F\n__all__ = ['F']\n"),
                     [])
    self.assertIn("names 'G', which it does not define",
                  Problems('m.py', "__all__ = ['F', 'G']\ndef F(): pass\n")[0])
    self.assertIn('has no __all__', Problems('m.py', 'def F(): pass\n')[0])
    self.assertIn("the private '_F'",
                  Problems('m.py', "__all__ = ['_F']\n_F = 1\n")[0])


if __name__ == '__main__':
  absltest.main()
