"""Tests of gpipe_tf.model_registry: names from module paths, lookups, closest names."""

import types


import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import base_experiment  # pylint: disable=g-import-not-at-top
from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
from params.synthetic import mlp  # pylint: disable=g-import-not-at-top

_FAKE_MODULE = 'params.faketask.fakedata'


def _DefineIn(module_name, name, bases, methods):
  """A class as if defined in module `module_name`."""
  cls = types.new_class(name, bases, exec_body=lambda ns: ns.update(methods))
  cls.__module__ = module_name
  return cls


class RegistryTest(tf.test.TestCase):

  def _Register(self, cls):
    registered = model_registry.RegisterSingleTaskModel(cls)
    name = model_registry.ModelName(cls)
    self.addCleanup(model_registry._REGISTRY.pop, name, None)  # pylint: disable=protected-access
    return registered, name

  def testNameComesFromTheModulePath(self):
    self.assertIs(model_registry.GetClass('synthetic.mlp.Tiny'), mlp.Tiny)
    self.assertEqual(model_registry.ModelName(mlp.Tiny), 'synthetic.mlp.Tiny')
    cls = _DefineIn(_FAKE_MODULE, 'Foo',
                    (base_experiment.SingleTaskModelParams,), {})
    registered, name = self._Register(cls)
    self.assertIs(registered, cls)
    self.assertEqual(name, 'faketask.fakedata.Foo')
    self.assertIs(model_registry.GetClass('faketask.fakedata.Foo'), cls)
    self.assertIn('faketask.fakedata.Foo', model_registry.ListModels())

  def testListModelsImportsEveryExperimentModule(self):
    self.assertIn('synthetic.mlp.Tiny', model_registry.ListModels())

  def testUnknownNameListsClosest(self):
    with self.assertRaises(model_registry.ModelNotFoundError) as cm:
      model_registry.GetClass('synthetic.mlp.Tinny')
    self.assertIsInstance(cm.exception, LookupError)
    self.assertIn("'synthetic.mlp.Tinny'", str(cm.exception))
    self.assertIn('Closest registered names: synthetic.mlp.Tiny',
                  str(cm.exception))
    with self.assertRaisesRegex(model_registry.ModelNotFoundError,
                                'synthetic.mlp.Tiny'):
      model_registry.GetClass('nosuchtask.nosuchdata.Tiny')

  def testSubclassOverridingOneMethodIsANewExperiment(self):
    def Task(self):
      p = mlp.Tiny.Task(self)
      p.model.layers[0].output_dim = 128
      p.model.layers[2].input_dim = 128
      return p
    wide = _DefineIn(_FAKE_MODULE, 'Wide', (mlp.Tiny,), {'Task': Task})
    _, name = self._Register(wide)
    tiny = model_registry.GetParams('synthetic.mlp.Tiny')
    new = model_registry.GetParams(name)
    self.assertEqual(new.train, tiny.train)
    self.assertEqual(new.test, tiny.test)
    self.assertEqual(new.task.model.layers[0].output_dim, 128)
    self.assertEqual(tiny.task.model.layers[0].output_dim, mlp.Tiny.HIDDEN_DIM)
    task = new.task.Instantiate()
    self.assertEqual(task.model.layers[0].w.shape, (16, 128))

  def testDuplicateNameOfAnotherClassRejected(self):
    first = _DefineIn(_FAKE_MODULE, 'Dup',
                      (base_experiment.SingleTaskModelParams,), {})
    self._Register(first)
    self._Register(first)  # The same class again is fine.
    second = _DefineIn(_FAKE_MODULE, 'Dup',
                       (base_experiment.SingleTaskModelParams,), {})
    with self.assertRaisesRegex(model_registry.DuplicateModelError,
                                'faketask.fakedata.Dup'):
      model_registry.RegisterSingleTaskModel(second)
    self.assertIs(model_registry.GetClass('faketask.fakedata.Dup'), first)

  def testOnlyExperimentsCanRegister(self):
    with self.assertRaises(TypeError):
      model_registry.RegisterSingleTaskModel(object)

  def testGetParamsOfOneMethod(self):
    train = model_registry.GetParams('synthetic.mlp.Tiny', 'Train')
    self.assertEqual(train.batch_size, mlp.Tiny.BATCH_SIZE)
    self.assertTrue(train.repeat)
    self.assertFalse(model_registry.GetParams('synthetic.mlp.Tiny',
                                              'Test').repeat)
    with self.assertRaisesRegex(model_registry.UnknownDatasetError,
                                "'Train', 'Test' or 'Task'"):
      model_registry.GetParams('synthetic.mlp.Tiny', 'Dev')


if __name__ == '__main__':
  tf.test.main()
