"""Tests of the lm.* and mt.* experiments and of gpipe_tf.tasks.sequence (tasks, decoding)."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order

import numpy as np
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.tasks import sequence
from gpipe_tf.data import text_inputs
from gpipe_tf.layers import base_layer
from gpipe_tf.pipeline import PipeliningLayer

_LM = ['lm.synthetic.TransformerL_3', 'lm.synthetic.TransformerL_13',
       'lm.synthetic.TransformerL_103', 'lm.synthetic.TransformerL_415',
       'lm.synthetic.TransformerL_1663']
_MT = ['mt.multilingual.T_6_8192_16', 'mt.multilingual.T_24_8192_16',
       'mt.multilingual.T_12_16384_32', 'mt.multilingual.T_32_16384_32',
       'mt.multilingual.T_64_16384_32']
_TINY = dict(NUM_LAYERS=2, MODEL_DIM=8, HIDDEN_DIM=16, NUM_HEADS=2,
             NUM_PARTITIONS=2, NUM_MICRO_BATCHES=2, BATCH_SIZE=4)
_TINY_LM = dict(_TINY, VOCAB_SIZE=20, SEQ_LEN=6, NUM_EXAMPLES=8)
_TINY_MT = dict(_TINY, VOCAB_SIZE=48, MAX_LENGTH=16, ATTEN_DIM_PER_HEAD=4)


class _FixedLogits(base_layer.BaseLayer):
  """Stand-in model: returns Params.logits (+ 0 * w) and its last input."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('logits', None, 'Nested list [B, T, V].')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [1])

  def FProp(self, *inputs, training=False):
    return tf.constant(self.p.logits, tf.float32) + 0.0 * self.w, inputs[-1]


class _CountUp(base_layer.BaseLayer):
  """Translation stand-in: predicts tgt_ids[t] + src_ids[0] at position t."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 32, 'V.')
    return p

  def FProp(self, src, src_pad, tgt, tgt_pad, training=False):
    nxt = (tgt + src[:, :1]) % self.p.vocab_size
    return tf.one_hot(nxt, self.p.vocab_size) * 5.0, tgt_pad


def _LogSoftmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class SequenceTasksTest(tf.test.TestCase):

  def testLanguageModelLossIgnoresPadding(self):
    logits = np.random.default_rng(0).normal(size=[2, 3, 5]).tolist()
    labels = np.array([[1, 2, 3], [4, 0, 2]], np.int32)
    paddings = np.array([[0, 0, 0], [0, 0, 1]], np.float32)
    task = sequence.LanguageModelTask.Params().Set(
        model=_FixedLogits.Params().Set(logits=logits)).Instantiate()
    loss, metrics = task.ComputeLoss({'ids': labels, 'labels': labels,
                                      'paddings': paddings})
    nll = -np.take_along_axis(_LogSoftmax(logits), labels[..., None], -1)[..., 0]
    keep = paddings == 0
    self.assertAllClose(loss, nll[keep].mean(), rtol=1e-5)
    self.assertAllClose(metrics['log_pplx'], nll[keep].mean(), rtol=1e-5)
    hits = np.argmax(logits, -1) == labels
    self.assertAllClose(metrics['accuracy'], hits[keep].mean())
    self.assertAllClose(metrics['num_tokens'], 2.5)

  def testTranslationLabelSmoothing(self):
    logits = np.random.default_rng(1).normal(size=[1, 2, 4]).tolist()
    labels = np.array([[3, 1]], np.int32)
    model = _FixedLogits.Params().Set(logits=logits)
    task = sequence.TranslationTask.Params().Set(
        model=model, label_smoothing=0.2).Instantiate()
    loss, metrics = task.ComputeLoss({
        'src_ids': labels, 'src_paddings': np.zeros([1, 2], np.float32),
        'tgt_ids': labels, 'tgt_labels': labels,
        'tgt_paddings': np.zeros([1, 2], np.float32)})
    log_p = _LogSoftmax(logits)[0]
    nll = -log_p[[0, 1], labels[0]]
    want = (0.8 * nll - 0.2 * log_p.mean(-1)).mean()
    self.assertAllClose(loss, want, rtol=1e-5)
    self.assertAllClose(metrics['log_pplx'], nll.mean(), rtol=1e-5)
    with self.assertRaisesRegex(ValueError, 'label_smoothing'):
      sequence.TranslationTask.Params().Set(
          model=model, label_smoothing=1.0).Instantiate()

  def testGreedyDecodeFeedsBackAndStopsAtEos(self):
    task = sequence.TranslationTask.Params().Set(
        model=_CountUp.Params(), bos_id=3, eos_id=6, pad_id=0).Instantiate()
    batch = {'src_ids': tf.constant([[1, 9], [2, 9]]),
             'src_paddings': tf.zeros([2, 2])}
    ids = task.Decode(batch, max_len=5)
    # Row 0 counts 4, 5, 6 (EOS) then pads; row 1 skips 6 and never stops.
    self.assertAllEqual(ids, [[4, 5, 6, 0, 0], [5, 7, 9, 11, 13]])
    self.assertAllEqual(tf.function(lambda b: task.Decode(b, 5))(batch), ids)


def _Tiny(name, **extra):
  cls = model_registry.GetClass(name)
  attrs = dict(_TINY_LM if name.startswith('lm.') else _TINY_MT, **extra)
  return type(cls.__name__ + 'Tiny', (cls,), attrs)


class ExperimentsTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._corpus = tempfile.mkdtemp()
    text_inputs.WriteReversalCorpus(cls._corpus, num_train=24, num_test=8,
                                    languages=('rev', 'mir'))

  def testRegisteredWithThePapersPartitions(self):
    self.assertContainsSubset(_LM + _MT, model_registry.ListModels())
    models = {n: model_registry.GetParams(n).task.model for n in _LM + _MT}
    self.assertEqual([models[n].num_partitions for n in _LM],
                     [1, 1, 8, 32, 128])
    self.assertEqual([models[n].num_micro_batches for n in _LM],
                     [1, 32, 32, 32, 32])
    self.assertEqual([models[n].num_partitions for n in _MT], [1, 4, 2, 8, 16])
    self.assertEqual([models[n].num_micro_batches for n in _MT],
                     [1, 16, 8, 32, 64])
    for name, model in models.items():
      self.assertIsNotNone(model.layers[-1].logits_clip, name)
      self.assertGreater(model.layers[1].ffn_init_scale_by_num_layers, 0, name)

  def testOnePipelinedTrainingStepEach(self):
    for name in _LM + _MT:
      with self.subTest(name=name):
        params = _Tiny(name, DATA_FOLDER=self._corpus)().ExperimentParams()
        base_experiment.ApplyOverrides(params, 'model.remat : "always"')
        task = params.task.Instantiate()
        self.assertIsInstance(task.model, PipeliningLayer)
        self.assertLen(task.model.balance, 2)
        batch = next(iter(params.train.Instantiate().GetDataset()))
        opt = task.CreateOptimizer()
        with tf.GradientTape() as tape:
          loss, metrics = task.ComputeLoss(batch, training=True)
        variables = task.trainable_variables
        grads = tape.gradient(loss, variables)
        self.assertTrue(all(g is not None for g in grads))
        before = [v.numpy() for v in variables]
        opt.apply_gradients(zip(grads, variables))
        self.assertTrue(np.isfinite(float(loss)))
        self.assertBetween(float(metrics['accuracy']), 0.0, 1.0)
        self.assertTrue(any(not np.allclose(b, v.numpy())
                            for b, v in zip(before, variables)))

  def testDecodeTinyTranslationModel(self):
    params = _Tiny(_MT[1], DATA_FOLDER=self._corpus)().ExperimentParams()
    task = params.task.Instantiate()
    batch = next(iter(params.test.Instantiate().GetDataset()))
    ids = task.Decode(batch, max_len=6).numpy()
    self.assertEqual(ids.shape, (4, 6))
    self.assertTrue(((ids >= 0) & (ids < _TINY_MT['VOCAB_SIZE'])).all())
    # Teacher forcing the decoded tokens reproduces every greedy choice up to
    # a row's first EOS (causal attention: later inputs do not matter).
    tgt = np.concatenate([np.full([4, 1], sequence.BOS_ID), ids[:, :-1]],
                         1).astype(np.int32)
    logits, _ = task.model.FProp(batch['src_ids'], batch['src_paddings'], tgt,
                                 tf.zeros([4, 6]))
    best = np.argmax(logits.numpy(), -1)
    for row, want in zip(best, ids):
      eos = np.flatnonzero(want == sequence.EOS_ID)
      end = eos[0] + 1 if eos.size else len(want)
      self.assertAllEqual(row[:end], want[:end])
      self.assertTrue((want[end:] == sequence.PAD_ID).all())

if __name__ == '__main__':
  tf.test.main()
