"""Tests of gpipe_tf.layers.base_layer: frozen Params, the layer tree, variables drawn from their paths, recompute scope."""

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import initializers


class _Leaf(base_layer.BaseLayer):
  """One [2, 3] weight."""

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [2, 3])


class _Tree(base_layer.BaseLayer):
  """A child 'head' and a list 'blocks' of two leaves."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('leaf', _Leaf.Params(), 'Template of every leaf.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateChild('head', self.p.leaf)
    self.CreateChildren('blocks', [self.p.leaf.Copy().Set(name='x'),
                                   self.p.leaf.Copy().Set(name='x')])


class BaseLayerTest(tf.test.TestCase):

  def testParamsAreAFrozenCopy(self):
    p = _Leaf.Params().Set(name='leaf')
    layer = p.Instantiate()
    self.assertIsNot(layer.params, p)
    self.assertTrue(layer.params.IsFrozen())
    self.assertFalse(p.IsFrozen())
    with self.assertRaises(hyperparams.FrozenParamsError):
      layer.p.name = 'other'

  def testTreePathsAndVariableNames(self):
    tree = _Tree.Params().Set(name='model').Instantiate()
    self.assertEqual(tree.head.path, 'model/head')
    # Duplicate names fall back to '<list>_<i>'.
    self.assertEqual([b.path for b in tree.blocks],
                     ['model/blocks_0', 'model/blocks_1'])
    self.assertEqual(sorted(v.name for v in tree.variables),
                     ['model/blocks_0/w:0', 'model/blocks_1/w:0',
                      'model/head/w:0'])
    self.assertEqual(tree.NumParams(), 3 * 6)

  def testATreeBuiltUnderADeviceKeepsItsVariablesThere(self):
    # CreateChildren without devices builds under the caller's scope: it
    # built under tf.device(None), which put the blocks' variables on the
    # default device (a SequentialLayer on a benchmark's worker kept them on
    # the chief).
    with tf.device('/device:CPU:1'):
      tree = _Tree.Params().Set(name='model').Instantiate()
    self.assertEqual(
        {v.name: tf.DeviceSpec.from_string(v.device).device_index
         for v in tree.variables},
        {'model/blocks_0/w:0': 1, 'model/blocks_1/w:0': 1,
         'model/head/w:0': 1})

  def testInitialValuesFollowThePathAndSeed(self):
    a = _Tree.Params().Set(name='model').Instantiate()
    b = _Tree.Params().Set(name='model').Instantiate()
    self.assertAllEqual(a.head.w, b.head.w)
    self.assertNotAllEqual(a.head.w, a.blocks[0].w)
    seeded = _Tree.Params().Set(name='model')
    seeded.leaf.random_seed = 5
    self.assertNotAllEqual(seeded.Instantiate().head.w, a.head.w)
    const = _Leaf.Params().Set(params_init=initializers.Constant(0.5))
    self.assertAllEqual(const.Instantiate().w, tf.fill([2, 3], 0.5))

  def testLayerSeedIsStableAndSeedable(self):
    layer = _Leaf.Params().Set(name='leaf').Instantiate()
    self.assertEqual(layer.layer_seed,
                     _Leaf.Params().Set(name='leaf').Instantiate().layer_seed)
    seeded = _Leaf.Params().Set(name='leaf', random_seed=3).Instantiate()
    self.assertNotEqual(layer.layer_seed, seeded.layer_seed)

  def testEmptyNameIsAConfigError(self):
    with self.assertRaisesRegex(base_layer.LayerConfigError, 'Params.name'):
      _Leaf.Params().Set(name='').Instantiate()

  def testAbstractMethods(self):
    layer = base_layer.BaseLayer.Params().Instantiate()
    with self.assertRaises(NotImplementedError):
      layer.FProp(tf.ones([1]))
    with self.assertRaises(NotImplementedError):
      base_layer.BaseLayer.FPropMeta(layer.params, (1,))

  def testShapeChecks(self):
    self.assertEqual(base_layer.NumElements((None, 3, 4)), 12)
    self.assertEqual(base_layer.NumElements(()), 1)
    layer = _Leaf.Params().Set(name='leaf').Instantiate()
    layer.CheckLastDim(tf.ones([4, 2]), 2)
    with self.assertRaisesRegex(base_layer.LayerInputError,
                                r"'leaf' \(_Leaf\) expects input of shape "
                                r'\[\.\.\., 3\] but got \[4, 2\]'):
      layer.CheckLastDim(tf.ones([4, 2]), 3)
    base_layer.CheckMetaLastDim(layer.params, (None, 2), 2)
    with self.assertRaises(base_layer.LayerInputError):
      base_layer.CheckMetaLastDim(layer.params, (None, 2), 3)


if __name__ == '__main__':
  tf.test.main()
