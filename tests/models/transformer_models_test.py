"""Tests of gpipe_tf.models.transformer: Table 1 counts, FPropMeta == built, pipelined == sequential."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.models import transformer
from gpipe_tf.pipeline import PipeliningLayer

# Table 1 of the paper: Transformer-L layers -> parameters.
_TABLE1 = {3: 282.2e6, 13: 785.8e6, 103: 5.3e9, 415: 21.0e9, 1663: 83.9e9}
# Section 5: T(L, H, A) -> parameters as the paper rounds them.
_NMT = {(6, 8192, 16): 400e6, (24, 8192, 16): 1.3e9, (12, 16384, 32): 1.3e9,
        (32, 16384, 32): 3e9, (64, 16384, 32): 6e9}


def _TinyLM(**kw):
  return transformer.TransformerLM(3, model_dim=8, hidden_dim=16, num_heads=2,
                                   vocab_size=11, **kw)


def _TinyNMT(**kw):
  return transformer.TransformerNMT(2, hidden_dim=16, num_heads=2, model_dim=8,
                                    vocab_size=13, atten_dim_per_head=6, **kw)


def _LMInputs(b=4, t=5, v=11):
  ids = tf.random.stateless_uniform([b, t], [1, 2], 0, v, tf.int32)
  paddings = tf.constant([[0.0] * t] * (b - 1) + [[0.0] * (t - 2) + [1.0] * 2])
  return ids, paddings


def _NMTInputs(b=4, s=6, t=5, v=13):
  src = tf.random.stateless_uniform([b, s], [3, 4], 0, v, tf.int32)
  tgt = tf.random.stateless_uniform([b, t], [5, 6], 0, v, tf.int32)
  src_pad = tf.constant([[0.0] * s] * (b - 1) + [[0.0] * (s - 3) + [1.0] * 3])
  tgt_pad = tf.constant([[0.0] * (t - 1) + [1.0]] * b)
  return src, src_pad, tgt, tgt_pad


def _Seq(layers):
  return core.SequentialLayer.Params().Set(name='net',
                                           layers=layers).Instantiate()


class CountsTest(tf.test.TestCase):

  def testTable1TransformerL(self):
    d, h, v = 2048, 8192, 32000
    # Attention (4 projections with biases), feed-forward, two LayerNorms.
    per_layer = (4 * d * d + 4 * d) + (2 * d * h + h + d) + 2 * 2 * d
    constant = v * d + (d * v + v) + 2 * d  # Embedding, softmax, final LN.
    self.assertEqual(per_layer, 50_358_272)  # (785.8M - 282.2M) / 10.
    for num_layers, paper in _TABLE1.items():
      with self.subTest(num_layers=num_layers):
        n = transformer.NumParams(transformer.TransformerLM(num_layers),
                                  transformer.LMInputShapes(1024))
        self.assertEqual(n, constant + num_layers * per_layer)
        self.assertLess(abs(n / paper - 1.0), 0.01)

  def testLearnedPositionsAddATable(self):
    shapes = transformer.LMInputShapes(1024)
    sinusoid = transformer.NumParams(transformer.TransformerLM(3), shapes)
    learned = transformer.NumParams(
        transformer.TransformerLM(3, position_emb='learned'), shapes)
    self.assertEqual(learned - sinusoid, 1024 * 2048)

  def testNMTCounts(self):
    shapes = transformer.NMTInputShapes(128, 128)
    for (l, h, a), paper in _NMT.items():
      with self.subTest(model=(l, h, a)):
        untied = transformer.NumParams(transformer.TransformerNMT(l, h, a),
                                       shapes)
        # As built (shared source/target table, untied softmax): within 5% of
        # the paper's rounded sizes. Tied would save the softmax weight.
        self.assertLess(abs(untied / paper - 1.0), 0.05)
        tied = untied - 64000 * 1024
        self.assertLess(tied, untied)
    wide = transformer.NumParams(transformer.TransformerNMT(12, 16384, 32),
                                 shapes)
    narrow_atten = transformer.NumParams(
        transformer.TransformerNMT(12, 16384, 32, atten_dim_per_head=32),
        shapes)
    # 3 attentions per encoder+decoder pair, each 1024 channels narrower in
    # 4 D x channels matrices and 3 channel biases.
    self.assertEqual(wide - narrow_atten, 12 * 3 * (4 * 1024 + 3) * 1024)

  def testFlopsAreTwicePerParameterPerTokenPlusAttention(self):
    t, d = 1024, 2048
    metas = core.MetaOfSequence(transformer.TransformerLM(2),
                                tuple(transformer.LMInputShapes(t)))
    layer = metas[1]
    matmuls = 2 * layer.num_params * t
    attention = 2 * 2 * t * t * d
    self.assertGreater(layer.flops, matmuls + attention)
    self.assertLess(layer.flops, 1.05 * (matmuls + attention))


class MetaMatchesBuiltTest(tf.test.TestCase):

  def _Check(self, layers, inputs):
    seq = _Seq(layers)
    shapes = tuple(tuple(x.shape.as_list()) for x in inputs)
    metas = core.MetaOfSequence(layers, shapes)
    for layer, meta in zip(seq.layers, metas):
      self.assertEqual(layer.NumParams(), meta.num_params, layer.path)
    xs = inputs
    for layer, meta in zip(seq.layers, metas):
      xs = core.AsTuple(layer.FProp(*xs))
      self.assertEqual([tuple(x.shape.as_list()) for x in xs],
                       [tuple(s) for s in meta.out_shapes], layer.path)
    return seq

  def testLM(self):
    for position in transformer.POSITION_EMBS:
      with self.subTest(position=position):
        self._Check(_TinyLM(position_emb=position, max_seq_len=5),
                    _LMInputs())

  def testNMT(self):
    seq = self._Check(_TinyNMT(), _NMTInputs())
    self.assertEqual(seq.layers[1].self_atten.query.w.shape, (8, 12))

  def testEmbeddingNeedsPairs(self):
    p = _TinyLM()[0]
    with self.assertRaises(base_layer.LayerInputError):
      p.cls.FPropMeta(p, (None, 5))
    layer = p.Instantiate()
    with self.assertRaises(base_layer.LayerInputError):
      layer.FProp(tf.zeros([2, 5], tf.int32))

  def testLearnedPositionsTooShort(self):
    p = _TinyLM(position_emb='learned', max_seq_len=4)[0]
    with self.assertRaisesRegex(base_layer.LayerInputError, 'max_seq_len 4'):
      p.cls.FPropMeta(p, (None, 5), (None, 5))


class LayersTest(tf.test.TestCase):

  def testSinusoid(self):
    signal = transformer.SinusoidPositions(7, 6).numpy()
    self.assertEqual(signal.shape, (7, 6))
    self.assertAllClose(signal[0], [0, 0, 0, 1, 1, 1])
    self.assertAllClose(signal[3, 0], np.sin(3.0))
    self.assertLessEqual(np.abs(signal).max(), 1.0)
    self.assertEqual(transformer.SinusoidPositions(3, 5).shape, (3, 5))

  def testFfnInitScaledByNumLayers(self):
    def Fc2Std(scaled):
      layers = transformer.TransformerLM(
          16, model_dim=32, hidden_dim=64, num_heads=2, vocab_size=5,
          ffn_init_scale_by_num_layers=scaled)
      layer = layers[1].Instantiate()
      return float(tf.math.reduce_std(layer.ffn.fc2.w))
    self.assertAllClose(Fc2Std(True) / Fc2Std(False), 0.25, rtol=0.1)

  def testLogitsClip(self):
    seq = _Seq(_TinyLM(logits_clip=0.05))
    logits, paddings = seq.FProp(*_LMInputs())
    self.assertLessEqual(float(tf.reduce_max(tf.abs(logits))), 0.05 + 1e-6)
    self.assertGreater(float(tf.reduce_max(tf.abs(logits))), 0.0)
    self.assertEqual(paddings.shape, (4, 5))

  def testCausalLM(self):
    seq = _Seq(_TinyLM())
    ids, paddings = _LMInputs()
    changed = tf.concat([ids[:, :3], (ids[:, 3:] + 1) % 11], axis=1)
    a, _ = seq.FProp(ids, paddings)
    b, _ = seq.FProp(changed, paddings)
    self.assertAllClose(a[:, :3], b[:, :3])
    self.assertNotAllClose(a[:, 3:], b[:, 3:])

  def testNMTSeesTheSource(self):
    seq = _Seq(_TinyNMT(dropout_prob=0.0, atten_dropout_prob=0.0,
                        relu_dropout_prob=0.0))
    src, src_pad, tgt, tgt_pad = _NMTInputs()
    a, _ = seq.FProp(src, src_pad, tgt, tgt_pad)
    b, _ = seq.FProp((src + 1) % 13, src_pad, tgt, tgt_pad)
    self.assertNotAllClose(a, b)
    # Padded source positions do not matter.
    masked = tf.where(src_pad > 0, (src + 5) % 13, src)
    d, _ = seq.FProp(masked, src_pad, tgt, tgt_pad)
    self.assertAllClose(a, d, atol=1e-5)


class PipelinedMatchesSequentialTest(tf.test.TestCase):

  def _AssertTransparent(self, layers, inputs):
    seq = _Seq(layers)
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=layers, num_partitions=2, num_micro_batches=2,
        input_shapes=[tuple([None] + x.shape.as_list()[1:]) for x in inputs]
    ).Instantiate()
    self.assertLen(pipe.balance, 2)

    def LossAndGrads(model):
      with tf.GradientTape() as tape:
        logits, _ = model.FProp(*inputs, training=True)
        w = tf.range(1.0, logits.shape[0] + 1)[:, None, None]
        loss = tf.reduce_sum(tf.sin(logits) * w)
      return logits, tape.gradient(loss, model.trainable_variables)

    y1, g1 = LossAndGrads(seq)
    y2, g2 = LossAndGrads(pipe)
    self.assertAllClose(y1, y2, rtol=1e-5, atol=1e-5)
    self.assertLen(g2, len(g1))
    for v, a, b in zip(seq.trainable_variables, g1, g2):
      self.assertIsNotNone(b, v.name)
      self.assertAllClose(tf.convert_to_tensor(a), tf.convert_to_tensor(b),
                          rtol=1e-4, atol=1e-5, msg=v.name)

  def testLM(self):
    self._AssertTransparent(_TinyLM(), _LMInputs())

  def testNMT(self):
    self._AssertTransparent(
        _TinyNMT(dropout_prob=0.0, atten_dropout_prob=0.0,
                 relu_dropout_prob=0.0), _NMTInputs())


if __name__ == '__main__':
  tf.test.main()
