"""Tests of the lm.* and mt.* experiments (the tasks themselves: tests/tasks/sequence_test.py)."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order

import numpy as np
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.tasks import sequence
from gpipe_tf.data import text_inputs
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
    # Shrunk by _TINY, the experiments of one family differ only in the
    # sizes it overrides: each builds its pipeline, and the first language
    # model trains a step (every eager step traces its cells' programs). A
    # translation experiment's pipelined training is
    # reversal_experiment_test's (an MT task on 2 cells, scored with BLEU)
    # and testDecodeTinyTranslationModel's below.
    for name in _LM + _MT:
      with self.subTest(name=name):
        params = _Tiny(name, DATA_FOLDER=self._corpus)().ExperimentParams()
        base_experiment.ApplyOverrides(params, 'model.remat : "always"')
        task = params.task.Instantiate()
        self.assertIsInstance(task.model, PipeliningLayer)
        self.assertLen(task.model.balance, 2)
        if name != _LM[0]:
          continue
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
