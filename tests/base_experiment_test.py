"""Tests of gpipe_tf.base_experiment: experiment Params from classes, and --model_params_override text."""

import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import hyperparams
from gpipe_tf import model_registry
from params.synthetic import mlp


class ExperimentParamsTest(tf.test.TestCase):

  def testAsExperimentParams(self):
    from_class = base_experiment.AsExperimentParams(mlp.Tiny)
    from_instance = base_experiment.AsExperimentParams(mlp.Tiny())
    self.assertEqual(from_class, from_instance)
    self.assertEqual([k for k, _ in from_class.IterParams()],
                     ['train', 'test', 'task'])
    copied = base_experiment.AsExperimentParams(from_class)
    copied.train.batch_size = 1
    self.assertEqual(from_class.train.batch_size, mlp.Tiny.BATCH_SIZE)
    with self.assertRaises(TypeError):
      base_experiment.AsExperimentParams(hyperparams.Params())
    with self.assertRaises(NotImplementedError):
      base_experiment.SingleTaskModelParams().ExperimentParams()

  def testOverrideKeys(self):
    p = model_registry.GetParams('synthetic.mlp.Tiny')
    base_experiment.ApplyOverrides(
        p, 'learning_rate_schedule.learning_rate : 0.5;'
        ' train.batch_size : 8\n task.label_smoothing : 0.1 # comment\n'
        "test.name : 'a;b#c'; model.layers[0].output_dim : 7")
    self.assertEqual(p.task.learning_rate_schedule.learning_rate, 0.5)
    self.assertEqual(p.train.batch_size, 8)
    self.assertEqual(p.task.label_smoothing, 0.1)
    self.assertEqual(p.test.name, 'a;b#c')
    self.assertEqual(p.task.model.layers[0].output_dim, 7)

  def testOverrideErrors(self):
    p = model_registry.GetParams('synthetic.mlp.Tiny')
    with self.assertRaisesRegex(hyperparams.UnknownParamError,
                                r"task\.modle.*Did you mean: task\.model"):
      base_experiment.ApplyOverrides(p, 'modle.name : "x"')
    with self.assertRaisesRegex(hyperparams.ParamsParseError,
                                "line 2: 'train.batch_size = 3'"):
      base_experiment.ApplyOverrides(p, 'label_smoothing : 0.2\n'
                                     'train.batch_size = 3')
    # A parse error changes nothing.
    self.assertEqual(p.task.label_smoothing, 0.0)
    # UnknownParamError is still an AttributeError for older callers.
    with self.assertRaises(AttributeError):
      base_experiment.ApplyOverrides(p, 'train.batch_sise : 3')

  def testAsExperimentParamsRejectsOtherObjects(self):
    with self.assertRaisesRegex(TypeError, 'got int'):
      base_experiment.AsExperimentParams(3)
    with self.assertRaisesRegex(TypeError, r"lack fields \['test', 'task'\]"):
      base_experiment.AsExperimentParams(
          _OnlyTrain())

  def testRelativePathsAreTaskPaths(self):
    a = model_registry.GetParams('synthetic.mlp.Tiny')
    b = model_registry.GetParams('synthetic.mlp.Tiny')
    base_experiment.ApplyOverrides(a, 'clip_gradient_norm_to_value : 2.0')
    base_experiment.ApplyOverrides(b, 'task.clip_gradient_norm_to_value : 2.0')
    self.assertEqual(a, b)
    self.assertEqual(a.task.clip_gradient_norm_to_value, 2.0)
    # Blank statements and comments alone change nothing.
    c = model_registry.GetParams('synthetic.mlp.Tiny')
    base_experiment.ApplyOverrides(c, ' ; # nothing\n;')
    self.assertEqual(c, model_registry.GetParams('synthetic.mlp.Tiny'))


def _OnlyTrain():
  p = hyperparams.Params()
  p.Define('train', None, 'Only this one.')
  return p


if __name__ == '__main__':
  tf.test.main()
