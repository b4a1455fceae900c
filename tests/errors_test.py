"""Every named error of gpipe_tf derives from gpipe_tf.errors.Error, so the trainer reports each as one line."""

import importlib
import inspect
import pkgutil

from absl.testing import absltest

import gpipe_tf
from gpipe_tf import errors


# Entry points define absl flags at import, so only one of them can be
# imported per process; the worker binary raises no error of its own.
_OTHER_ENTRY_POINTS = ('gpipe_tf.runtime.serve_worker',)


def _AllModules():
  """Every module of the gpipe_tf package (but other entry points), imported."""
  names = [info.name for info in pkgutil.walk_packages(gpipe_tf.__path__,
                                                       'gpipe_tf.')
           if info.name not in _OTHER_ENTRY_POINTS]
  return [importlib.import_module(name) for name in ['gpipe_tf'] + names]


def _NamedErrors(modules):
  """{qualified name: class} of the exception classes named *Error that
  gpipe_tf modules define (not the ones they import)."""
  found = {}
  for module in modules:
    for name, value in vars(module).items():
      if (inspect.isclass(value) and issubclass(value, BaseException) and
          name.endswith('Error') and value.__module__ == module.__name__):
        found[f'{module.__name__}.{name}'] = value
  return found


class ErrorsTest(absltest.TestCase):

  def testErrorIsAnException(self):
    self.assertTrue(issubclass(errors.Error, Exception))
    with self.assertRaisesRegex(errors.Error, 'what to change'):
      raise errors.Error('what is wrong; what to change')

  def testEveryNamedErrorDerivesFromError(self):
    modules = _AllModules()
    self.assertGreater(len(modules), 40)  # The walk found the subpackages.
    named = _NamedErrors(modules)
    # A sample of families from several subpackages, so a broken scan fails.
    for name in ('gpipe_tf.hyperparams.UnknownParamError',
                 'gpipe_tf.pipeline.partition.PartitionError',
                 'gpipe_tf.train.warm_start.WarmStartError',
                 'gpipe_tf.runtime.cluster.ClusterConfigError',
                 'gpipe_tf.data.inputs.InputConfigError',
                 'gpipe_tf.trainer.FlagError'):
      self.assertIn(name, named)
    strays = sorted(n for n, cls in named.items()
                    if cls is not errors.Error and
                    not issubclass(cls, errors.Error))
    self.assertEqual(strays, [], 'derive these from gpipe_tf.errors.Error')

  def testNamedErrorsKeepABuiltInBase(self):
    """`except ValueError` (or the like) written before still catches them."""
    for name, cls in _NamedErrors(_AllModules()).items():
      if cls is errors.Error:
        continue
      builtin = [b for b in cls.__mro__
                 if b.__module__ == 'builtins' and
                 b not in (Exception, BaseException, object)]
      self.assertNotEmpty(builtin, name)

  def testTheScanSeesAStray(self):
    module = type(errors)('gpipe_tf.fake_module')
    stray = type('StrayError', (ValueError,), {'__module__': module.__name__})
    module.StrayError = stray
    self.assertEqual(list(_NamedErrors([module])),
                     ['gpipe_tf.fake_module.StrayError'])
    self.assertFalse(issubclass(stray, errors.Error))


if __name__ == '__main__':
  absltest.main()
