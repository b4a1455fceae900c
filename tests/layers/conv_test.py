"""Tests for gpipe_tf.layers.conv against a NumPy convolution and pooling."""


import numpy as np
import tensorflow as tf


from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import conv
from gpipe_tf.layers import core


def _Pad(x, window, stride, dilation, padding, value=0.0):
  """Pads x [B,H,W,C] as TensorFlow does; returns (padded, out_h, out_w)."""
  outs, pads = [], []
  for axis in (1, 2):
    n, k, s, d = x.shape[axis], window[axis - 1], stride[axis - 1], dilation[
        axis - 1]
    eff = (k - 1) * d + 1
    if padding == 'SAME':
      out = -(-n // s)
      total = max((out - 1) * s + eff - n, 0)
      pads.append((total // 2, total - total // 2))
    else:
      out = -(-(n - eff + 1) // s)
      pads.append((0, 0))
    outs.append(out)
  padded = np.pad(x, [(0, 0), pads[0], pads[1], (0, 0)],
                  constant_values=value)
  return padded, outs[0], outs[1]


def _Windows(x, window, stride, dilation, padding, value=0.0):
  """Yields (a, c, slice [B,Ho,Wo,C]) for each kernel offset (a, c)."""
  xp, ho, wo = _Pad(x, window, stride, dilation, padding, value)
  (sh, sw), (dh, dw) = stride, dilation
  for a in range(window[0]):
    for c in range(window[1]):
      yield a, c, xp[:, a * dh:a * dh + (ho - 1) * sh + 1:sh,
                     c * dw:c * dw + (wo - 1) * sw + 1:sw, :]


def _NpConv(x, w, stride=(1, 1), padding='SAME', dilation=(1, 1)):
  out = 0.0
  for a, c, win in _Windows(x, w.shape[:2], stride, dilation, padding):
    out = out + np.einsum('bijc,co->bijo', win, w[a, c])
  return out


def _NpDepthwise(x, w, stride=(1, 1), padding='SAME', dilation=(1, 1)):
  out = 0.0
  for a, c, win in _Windows(x, w.shape[:2], stride, dilation, padding):
    out = out + np.einsum('bijc,cm->bijcm', win, w[a, c])
  return out.reshape(out.shape[:3] + (-1,))


def _NpPool(x, window, stride, padding, pooling_type):
  wins = np.stack([win for _, _, win in _Windows(
      x, window, stride, (1, 1), padding, value=np.nan)])
  return np.nanmax(wins, 0) if pooling_type == 'MAX' else np.nanmean(wins, 0)


class ConvTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(0)
    self.x = self.rng.randn(2, 7, 6, 3).astype(np.float32)

  def _CheckMeta(self, p, x):
    layer = p.Instantiate()
    y = layer.FProp(tf.constant(x))
    meta = p.cls.FPropMeta(p, x.shape)
    self.assertEqual(meta.out_shapes, (tuple(y.shape.as_list()),))
    self.assertEqual(meta.num_params, layer.NumParams())
    self.assertGreater(meta.flops, 0)
    return meta

  def testConv2DMatchesNumpy(self):
    cases = [dict(padding='SAME', filter_stride=(2, 1)),
             dict(padding='VALID', filter_stride=(1, 2)),
             dict(padding='SAME', dilation_rate=(2, 2)),
             dict(padding='VALID', dilation_rate=(2, 1))]
    for kw in cases:
      with self.subTest(**kw):
        p = conv.Conv2DLayer.Params().Set(
            name='conv', filter_shape=(3, 2, 3, 4), has_bias=True,
            activation='RELU', **kw)
        layer = p.Instantiate()
        layer.b.assign(self.rng.randn(4).astype(np.float32))
        y = layer.FProp(tf.constant(self.x))
        expected = np.maximum(_NpConv(
            self.x, layer.w.numpy(), p.filter_stride, p.padding,
            p.dilation_rate) + layer.b.numpy(), 0.0)
        self.assertAllClose(expected, y, atol=1e-5)
        self._CheckMeta(p, self.x)

  def testConv2DFlopsCountMultiplyAdds(self):
    p = conv.Conv2DLayer.Params().Set(name='c', filter_shape=(3, 3, 3, 5),
                                      filter_stride=(2, 2))
    meta = conv.Conv2DLayer.FPropMeta(p, (2, 7, 6, 3))
    self.assertEqual(meta.out_shapes, ((2, 4, 3, 5),))
    self.assertEqual(meta.flops, 2 * (2 * 4 * 3) * (3 * 3 * 3 * 5))
    self.assertEqual(meta.num_params, 3 * 3 * 3 * 5)

  def testUnknownDimsStayUnknownInMeta(self):
    p = conv.Conv2DLayer.Params().Set(name='c', filter_shape=(3, 3, 3, 5))
    meta = conv.Conv2DLayer.FPropMeta(p, (None, None, 6, 3))
    self.assertEqual(meta.out_shapes, ((None, None, 6, 5),))

  def testDepthwiseMatchesNumpy(self):
    for kw in (dict(padding='SAME', filter_stride=(2, 2)),
               dict(padding='VALID', dilation_rate=(1, 2))):
      with self.subTest(**kw):
        p = conv.DepthwiseConv2DLayer.Params().Set(
            name='dw', filter_shape=(3, 3, 3, 2), has_bias=True, **kw)
        layer = p.Instantiate()
        layer.b.assign(self.rng.randn(6).astype(np.float32))
        y = layer.FProp(tf.constant(self.x))
        expected = _NpDepthwise(self.x, layer.w.numpy(), p.filter_stride,
                                p.padding, p.dilation_rate) + layer.b.numpy()
        self.assertAllClose(expected, y, atol=1e-5)
        self.assertEqual(self._CheckMeta(p, self.x).num_params, 3 * 3 * 3 * 2
                         + 6)

  def testSeparableMatchesNumpy(self):
    p = conv.SeparableConv2DLayer.Params().Set(
        name='sep', filter_shape=(3, 3, 3, 5), channel_multiplier=2,
        has_bias=True, activation='TANH', filter_stride=(2, 2))
    layer = p.Instantiate()
    layer.b.assign(self.rng.randn(5).astype(np.float32))
    y = layer.FProp(tf.constant(self.x))
    depthwise = _NpDepthwise(self.x, layer.depthwise_w.numpy(), (2, 2))
    expected = np.tanh(np.einsum('bijc,co->bijo', depthwise,
                                 layer.pointwise_w.numpy()[0, 0]) +
                       layer.b.numpy())
    self.assertAllClose(expected, y, atol=1e-5)
    meta = self._CheckMeta(p, self.x)
    self.assertEqual(meta.num_params, 3 * 3 * 3 * 2 + 6 * 5 + 5)

  def testPoolingMatchesNumpy(self):
    for pooling_type in ('MAX', 'AVG'):
      for padding in ('SAME', 'VALID'):
        with self.subTest(pooling_type=pooling_type, padding=padding):
          p = conv.PoolingLayer.Params().Set(
              name='pool', pooling_type=pooling_type, window_shape=(3, 2),
              window_stride=(2, 2), padding=padding)
          y = p.Instantiate().FProp(tf.constant(self.x))
          self.assertAllClose(
              _NpPool(self.x, (3, 2), (2, 2), padding, pooling_type), y,
              atol=1e-5)
          self.assertEqual(self._CheckMeta(p, self.x).num_params, 0)

  def testGlobalPooling(self):
    for pooling_type, fn in (('AVG', np.mean), ('MAX', np.max)):
      p = conv.GlobalPoolingLayer.Params().Set(name='g',
                                               pooling_type=pooling_type)
      y = p.Instantiate().FProp(tf.constant(self.x))
      self.assertAllClose(fn(self.x, axis=(1, 2)), y, atol=1e-6)
      self._CheckMeta(p, self.x)
    self.assertEqual(
        conv.GlobalPoolingLayer.FPropMeta(p, (None, 4, 4, 8)).out_shapes,
        ((None, 8),))

  def testWrongChannelsOrRankRaise(self):
    p = conv.Conv2DLayer.Params().Set(name='c', filter_shape=(3, 3, 4, 5))
    layer = p.Instantiate()
    with self.assertRaisesRegex(base_layer.LayerInputError, "'c'.*4"):
      layer.FProp(tf.constant(self.x))
    with self.assertRaises(base_layer.LayerInputError):
      conv.Conv2DLayer.FPropMeta(p, self.x.shape)
    with self.assertRaisesRegex(base_layer.LayerInputError, 'rank 4'):
      layer.FProp(tf.zeros([2, 5, 4]))
    for cls in (conv.PoolingLayer, conv.GlobalPoolingLayer):
      with self.assertRaises(base_layer.LayerInputError):
        cls.Params().Set(name='p').Instantiate().FProp(tf.zeros([2, 4]))
      with self.assertRaises(base_layer.LayerInputError):
        cls.FPropMeta(cls.Params().Set(name='p'), (2, 4))

  def testBadParamsRaise(self):
    bad = [
        (conv.Conv2DLayer, dict(filter_shape=(3, 3, 0, 4))),
        (conv.Conv2DLayer, dict(filter_shape=(3, 3, 2, 4), padding='FULL')),
        (conv.Conv2DLayer, dict(filter_shape=(3, 3, 2, 4),
                                filter_stride=(2, 2), dilation_rate=(2, 2))),
        (conv.DepthwiseConv2DLayer, dict(filter_shape=(3, 3, 2, 1),
                                         filter_stride=(1, 2))),
        (conv.SeparableConv2DLayer, dict(filter_shape=(3, 3, 2, 4),
                                         channel_multiplier=0)),
        (conv.PoolingLayer, dict(pooling_type='MIN')),
        (conv.PoolingLayer, dict(window_shape=(2,))),
        (conv.GlobalPoolingLayer, dict(pooling_type='SUM')),
    ]
    for cls, kw in bad:
      with self.subTest(cls=cls.__name__, **kw):
        with self.assertRaisesRegex(ValueError, "'bad'"):
          cls.Params().Set(name='bad', **kw).Instantiate()

  def testGradientsReachAllVariables(self):
    layers = core.SequentialLayer.Params().Set(name='net', layers=[
        conv.Conv2DLayer.Params().Set(name='c', filter_shape=(3, 3, 3, 4),
                                      has_bias=True, activation='RELU'),
        conv.DepthwiseConv2DLayer.Params().Set(name='d',
                                               filter_shape=(3, 3, 4, 2),
                                               has_bias=True),
        conv.SeparableConv2DLayer.Params().Set(name='s',
                                               filter_shape=(3, 3, 8, 4),
                                               has_bias=True),
        conv.PoolingLayer.Params().Set(name='p'),
        conv.GlobalPoolingLayer.Params().Set(name='g'),
    ])
    net = layers.Instantiate()
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(net.FProp(tf.constant(self.x))))
    grads = tape.gradient(loss, net.trainable_variables)
    self.assertLen(grads, 7)
    for v, g in zip(net.trainable_variables, grads):
      self.assertIsNotNone(g, v.name)
      self.assertGreater(float(tf.reduce_sum(tf.abs(g))), 0.0, v.name)
    meta = core.SequentialLayer.FPropMeta(layers, self.x.shape)
    self.assertEqual(meta.num_params, net.NumParams())
    self.assertEqual(meta.out_shapes, ((2, 4),))


if __name__ == '__main__':
  tf.test.main()
