"""keras_graph.Walk: a Keras tensor at several places of a call's outputs holds its last place's value, as in Keras's functional run (keras_hub's DFineDecoder declares one spec for every decoder layer's attention weights), so the converted model computes Keras's outputs and gradients."""

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.pipeline import keras_graph  # pylint: disable=g-import-not-at-top


@keras.saving.register_keras_serializable(package='gpipe_tf_graph_test')
class TwoSteps(keras.layers.Layer):
  """h1 = tanh(x w1), h2 = tanh(h1 w2); returns (h1, h2) but declares one
  spec for both, as DFineDecoder.compute_output_spec repeats one spec."""

  def build(self, input_shape):
    d = input_shape[-1]
    self.w1 = self.add_weight(name='w1', shape=(d, d))
    self.w2 = self.add_weight(name='w2', shape=(d, d))

  def call(self, x):
    h1 = keras.ops.tanh(keras.ops.matmul(x, self.w1))
    return h1, keras.ops.tanh(keras.ops.matmul(h1, self.w2))

  def compute_output_spec(self, x):
    spec = keras.KerasTensor(x.shape, x.dtype)
    return spec, spec


def _Model():
  """Both places of the one tensor are outputs, and a Dense reads it."""
  x = keras.Input((4,))
  first, second = TwoSteps(name='steps')(x)
  y = keras.layers.Dense(3, name='head')(first)
  return keras.Model(x, {'first': first, 'second': second, 'head': y})


class KerasGraphTest(tf.test.TestCase):

  def testRepeatedOutputTensorHoldsItsLastPlace(self):
    model = _Model()
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0.0, 0.5, w.shape) for w in model.weights])
    x = tf.constant(rng.normal(size=[4, 4]), tf.float32)
    steps = model.get_layer('steps')
    h1, h2 = steps(x)
    self.assertGreater(float(tf.reduce_max(tf.abs(h1 - h2))), 0.1)
    # What Keras computes: both places, and the Dense's input, are h2.
    want = model(x)
    self.assertAllClose(h2, want['first'])
    self.assertAllClose(h2, want['second'])
    self.assertAllClose(model.get_layer('head')(h2), want['head'])
    # The first place gets a Key nothing reads; the second the tensor's.
    graph = keras_graph.Walk(model)
    call = graph.calls[0]
    self.assertEqual('steps', call.name)
    self.assertNotEqual(call.outputs[0], call.outputs[1])
    self.assertEqual(graph.outputs['first'], call.outputs[1])
    self.assertEqual(graph.calls[1].args[0], call.outputs[1])
    # The converted model's step and inference are Keras's.
    targets = {'first': tf.zeros([4, 4]), 'head': tf.ones([4, 3]),
               'second': tf.ones([4, 4])}
    test_utils.AssertPipelineEqualsKeras(self, model, x, targets,
                                         [(1, 'gpipe'), (2, 'gpipe')])


if __name__ == '__main__':
  tf.test.main()
