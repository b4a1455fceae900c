"""Tests of gpipe_tf.models.amoebanet: Table 1 sizes, exact FPropMeta, pipelined gradients."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.models import amoebanet
from gpipe_tf.pipeline import PipeliningLayer

# (builder, L, D, image size, parameters in the GPipe paper).
_PAPER_SIZES = (
    (amoebanet.AmoebaNetD, 18, 208, 224, 82e6),
    (amoebanet.AmoebaNetD, 18, 416, 224, 318e6),
    (amoebanet.AmoebaNetD, 18, 544, 224, 542e6),
    (amoebanet.AmoebaNetD, 36, 544, 224, 1.05e9),
    (amoebanet.AmoebaNetD, 72, 512, 224, 1.8e9),
    (amoebanet.AmoebaNetB, 18, 512, 480, 557e6),
)
_TINY = dict(num_normal_layers=3, num_filters=8, num_classes=10,
             image_size=32)


def _Tiny(builder=amoebanet.AmoebaNetD, **kwargs):
  return builder(**dict(_TINY, **kwargs))


def _Images(batch, size=32, channels=3, seed=0):
  return tf.random.stateless_normal([batch, size, size, channels], [seed, 1])


class ParamCountTest(tf.test.TestCase):

  def testTable1SizesFromParams(self):
    for builder, layers, filters, size, paper in _PAPER_SIZES:
      with self.subTest(builder=builder.__name__, L=layers, D=filters):
        net = builder(layers, filters, 1000, image_size=None)
        count = amoebanet.NumParams(net, (None, size, size, 3))
        self.assertBetween(count / paper, 0.9, 1.1)

  def testLayoutOfTheNetwork(self):
    names = [p.name for p in amoebanet.AmoebaNetD(18, 208)]
    self.assertEqual(names[:4], ['stem', 'stem_cell_0', 'stem_cell_1',
                                 'cell_0'])
    self.assertEqual(names[-1], 'head')
    self.assertEqual(sum(n.startswith('cell_') for n in names), 18)
    self.assertEqual(names.index('reduction_cell_0'), 9)  # After 6 cells.
    self.assertEqual(names.index('reduction_cell_1'), 16)
    cells = {p.name: p for p in amoebanet.AmoebaNetD(18, 208)}
    self.assertEqual(cells['stem_cell_0'].num_filters, 52)
    self.assertEqual(cells['cell_0'].num_filters, 208)
    self.assertEqual(cells['cell_17'].num_filters, 832)

  def testParamsDoNotDependOnImageSize(self):
    net = amoebanet.AmoebaNetB(6, 32, 10, image_size=None)
    self.assertEqual(amoebanet.NumParams(net, (None, 64, 64, 3)),
                     amoebanet.NumParams(net, (None, 97, 97, 3)))


class MetaMatchesBuiltLayersTest(tf.test.TestCase):

  def _CheckChain(self, layer_params, images):
    metas = core.MetaOfSequence(layer_params, ((None,) + tuple(
        images.shape[1:]),))
    net = core.SequentialLayer.Params().Set(
        name='net', layers=layer_params).Instantiate()
    xs = (images,)
    for layer, meta in zip(net.layers, metas):
      inputs = xs
      xs = core.AsTuple(layer.FProp(*xs, training=True))
      self.assertEqual(layer.NumParams(), meta.num_params, layer.path)
      self.assertEqual([t.shape.as_list()[1:] for t in xs],
                       [list(s[1:]) for s in meta.out_shapes], layer.path)
      if isinstance(layer, amoebanet.AmoebaCellLayer):
        # A cell returns (output, its input x): the next cell's x_prev.
        self.assertLen(xs, 2)
        self.assertIs(xs[1], inputs[0])
    self.assertEqual(xs[0].shape.as_list(), [images.shape[0], 10])
    self.assertAllInRange(xs[0], -1e4, 1e4)
    self.assertEqual(net.NumParams(), amoebanet.NumParams(
        layer_params, (None,) + tuple(images.shape[1:])))

  def testAmoebaNetD(self):
    self._CheckChain(_Tiny(), _Images(2))

  def testAmoebaNetBWithDropPathOnOddImages(self):
    self._CheckChain(_Tiny(amoebanet.AmoebaNetB, image_size=29,
                           drop_path_keep_prob=0.8), _Images(2, size=29))


class PipelineTest(tf.test.TestCase):

  def _Gradients(self, model, images):
    with tf.GradientTape() as tape:
      logits = model.FProp(images, training=True)
      loss = tf.reduce_sum(tf.square(logits))
    return logits, tape.gradient(loss, model.trainable_variables)

  def testPipelinedEqualsSequentialOnEachMicroBatch(self):
    # One normal cell per stack: every kind of cell and operation. Two
    # micro-batches with remat 'always' (the rematerialised backward of
    # these cells; image_experiments_test's one training step runs it too):
    # BatchNorm sees one micro-batch at a time, so the pipeline must give
    # SequentialLayer's outputs on each micro-batch and the sum of its
    # gradients there (the loss is a sum over the examples), with the
    # (x, x_prev) pair crossing the cell boundary; and every variable gets
    # a gradient. (One pipeline instead of two, one per claim: the tracing
    # of its cells is what costs.)
    layers = _Tiny(image_size=16, num_normal_layers=1, num_stem_cells=0,
                   stem_stride=1, dropout_keep_prob=1.0)
    images = _Images(4, size=16)
    seq = core.SequentialLayer.Params().Set(name='model',
                                            layers=layers).Instantiate()
    pipe = PipeliningLayer.Params().Set(
        name='model', layers=layers, num_partitions=2, balance=[3, 2],
        num_micro_batches=2, remat='always').Instantiate()
    halves = [self._Gradients(seq, x) for x in tf.split(images, 2)]
    want_y = tf.concat([y for y, _ in halves], 0)
    want_g = [a + b for a, b in zip(halves[0][1], halves[1][1])]
    got_y, got_g = self._Gradients(pipe, images)
    self.assertEqual(got_y.shape.as_list(), [4, 10])
    self.assertAllClose(got_y, want_y, rtol=1e-4, atol=1e-4)
    self.assertLen(got_g, len(want_g))
    for want, got in zip(want_g, got_g):
      self.assertAllClose(got, want, rtol=1e-3, atol=1e-4)
    names = [v.name for v, g in zip(pipe.trainable_variables, got_g)
             if g is None or not np.any(g.numpy())]
    self.assertEqual(names, [])


class ErrorsTest(tf.test.TestCase):

  def testFiltersMustSuitTheStemCells(self):
    with self.assertRaisesRegex(ValueError, 'multiple of 2'):
      amoebanet.AmoebaNetD(3, 6)

  def testUnknownOperation(self):
    normal, reduction = amoebanet.CELLS['D']
    bad = normal._replace(operations=('conv_9x9',) + normal.operations[1:])
    with self.assertRaisesRegex(amoebanet.CellSpecError, 'conv_9x9'):
      amoebanet.AmoebaNet((bad, reduction), 3, 8)

  def testWiringReadingAFutureState(self):
    normal, reduction = amoebanet.CELLS['D']
    bad = normal._replace(hiddenstate_indices=(4,) +
                          normal.hiddenstate_indices[1:])
    with self.assertRaisesRegex(amoebanet.CellSpecError, 'hidden state 4'):
      amoebanet.AmoebaNet((bad, reduction), 3, 8)

  def testCellRejectsAMissingPrevInput(self):
    cell_params = _Tiny()[3]  # cell_0 takes (x, x_prev).
    self.assertEqual(cell_params.name, 'cell_0')
    channels = cell_params.input_channels
    with self.assertRaises(base_layer.LayerInputError):
      cell_params.cls.FPropMeta(cell_params, (None, 4, 4, channels))
    cell = cell_params.Instantiate()
    with self.assertRaises(base_layer.LayerInputError):
      cell.FProp(_Images(1, size=4, channels=channels))

  def testImageTooSmall(self):
    with self.assertRaisesRegex(ValueError, 'image'):
      amoebanet.AmoebaNetD(3, 8, image_size=2)


if __name__ == '__main__':
  tf.test.main()
