"""Params stash/pop: names pair up or raise a named error, SequentialLayer and MetaOfSequence move stashed tensors and shapes to the layer that pops them."""

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import skips


def _Fc(name, din=4, dout=4, **kw):
  return core.FCLayer.Params().Set(name=name, input_dim=din, output_dim=dout,
                                   activation='NONE', **kw)


def _Branch(name, *names):
  return core.BranchLayer.Params().Set(name=name, stash=names)


def _Merge(name, *names, op='add'):
  return core.MergeLayer.Params().Set(name=name, pop=names, op=op)


class CheckTest(tf.test.TestCase):

  def testSkipsInStashOrder(self):
    got = skips.Check([_Branch('a', 's1'), _Branch('b', 's2'),
                       _Merge('c', 's2'), _Merge('d', 's1')])
    self.assertEqual(got, (skips.Skip('s1', 0, 3), skips.Skip('s2', 1, 2)))
    self.assertEqual(skips.Crossing(got, [1, 2, 1]),
                     (('s1', 0, 2),))  # s2 stays inside cell 1.

  def testPopWithoutStash(self):
    with self.assertRaisesRegex(
        skips.PopWithoutStashError,
        r"layer 1 'c' pops 's9', but no earlier layer stashes it: add 's9' "
        'to the Params stash'):
      skips.Check([_Fc('a'), _Merge('c', 's9')])
    # A pop before its stash is the same mistake.
    with self.assertRaises(skips.PopWithoutStashError):
      skips.Check([_Merge('c', 's1'), _Branch('a', 's1')])

  def testPoppedTwice(self):
    with self.assertRaisesRegex(skips.PopWithoutStashError,
                                "layer 2 'd' pops 's1', which layer 1 'c' "
                                'already popped'):
      skips.Check([_Branch('a', 's1'), _Merge('c', 's1'), _Merge('d', 's1')])

  def testStashedTwice(self):
    with self.assertRaisesRegex(skips.StashedTwiceError,
                                "layer 1 'b' stashes 's1', which layer 0 'a' "
                                'stashes too'):
      skips.Check([_Branch('a', 's1'), _Branch('b', 's1'), _Merge('c', 's1')])

  def testStashNeverPopped(self):
    with self.assertRaisesRegex(skips.StashNeverPoppedError,
                                "'s2' by layer 1 'b'.*Pop each"):
      skips.Check([_Branch('a', 's1'), _Branch('b', 's2'), _Merge('c', 's1')])

  def testPopWithNothingStashedAtRunTime(self):
    # Layers built one by one, so no Params validation ran (was a KeyError).
    layers = [_Fc('a').Instantiate(), _Merge('c', 's1').Instantiate()]
    with self.assertRaisesRegex(skips.NothingStashedError,
                                r"'c' pops \['s1'\] but nothing is stashed"):
      core.RunWithSkips(layers, (tf.ones([2, 4]),), {}, False)

  def testErrorsAreNamed(self):
    for cls in (skips.PopWithoutStashError, skips.StashedTwiceError,
                skips.StashNeverPoppedError, skips.NothingStashedError):
      self.assertTrue(issubclass(cls, skips.SkipError))
      self.assertTrue(issubclass(cls, errors.Error))
      self.assertTrue(issubclass(cls, ValueError))


class SequentialTest(tf.test.TestCase):

  def _Layers(self):
    return [_Fc('e0', 3, 4), _Branch('b1', 's1'), _Fc('e1'),
            _Branch('b2', 's2'), _Fc('mid'), _Merge('m2', 's2', op='concat'),
            _Fc('d1', 8, 4), _Merge('m1', 's1'), _Fc('out', 4, 2)]

  def testSequentialLayerPopsWhatWasStashed(self):
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=self._Layers()).Instantiate()
    x = tf.random.stateless_normal([5, 3], seed=[1, 2])
    l = {layer.p.name: layer for layer in seq.layers}
    h0 = l['e0'].FProp(x)
    h1 = l['e1'].FProp(h0)
    h = l['d1'].FProp(tf.concat([l['mid'].FProp(h1), h1], -1))
    want = l['out'].FProp(h + h0)
    self.assertAllClose(want, seq.FProp(x))

  def testMetaChainsStashedShapes(self):
    metas = core.MetaOfSequence(self._Layers(), ((None, 3),))
    # Each layer's own outputs: a BranchLayer's copy is among them.
    self.assertEqual([m.out_shapes for m in metas], [
        ((None, 4),), ((None, 4), (None, 4)), ((None, 4),),
        ((None, 4), (None, 4)), ((None, 4),), ((None, 8),), ((None, 4),),
        ((None, 4),), ((None, 2),)])
    meta = core.SequentialLayer.FPropMeta(
        core.SequentialLayer.Params().Set(layers=self._Layers()), (None, 3))
    self.assertEqual(meta.out_shapes, ((None, 2),))

  def testBadPairingIsRefusedAtBuildAndInMeta(self):
    layers = self._Layers()[:-2] + [self._Layers()[-1]]  # 's1' never popped.
    with self.assertRaises(skips.StashNeverPoppedError):
      core.SequentialLayer.Params().Set(name='net', layers=layers
                                        ).Instantiate()
    with self.assertRaises(skips.StashNeverPoppedError):
      core.MetaOfSequence(layers, ((None, 3),))

  def testStashingMoreThanReturnedIsNamed(self):
    layers = [_Fc('a', 3, 4, stash=('s1', 's2')), _Merge('m', 's1', 's2')]
    with self.assertRaisesRegex(skips.SkipError, "layer 'a' stashes "
                                r"\['s1', 's2'\] but returns 1 outputs"):
      core.SequentialLayer.Params().Set(name='net', layers=layers
                                        ).Instantiate().FProp(tf.ones([2, 3]))

  def testParamsRoundTripAsText(self):
    p = core.SequentialLayer.Params().Set(name='net', layers=self._Layers())
    blank = [l.Copy().Set(stash=(), pop=()) for l in self._Layers()]
    q = core.SequentialLayer.Params().Set(name='net', layers=blank)
    q.FromText(p.ToText())
    self.assertIn('s1', q.layers[1].stash)
    self.assertEqual([l.stash for l in q.layers], [l.stash for l in p.layers])
    self.assertEqual([l.pop for l in q.layers], [l.pop for l in p.layers])

  def testMergeRefusesShapesItCannotMerge(self):
    with self.assertRaises(base_layer.LayerInputError):
      core.MergeLayer.FPropMeta(core.MergeLayer.Params(), (2, 4), (2, 5))


if __name__ == '__main__':
  tf.test.main()
