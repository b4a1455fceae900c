"""A keras_hub model from a local preset, fine-tuned in a pipeline: a tiny GPT2CausalLM saved with save_to_preset and loaded with from_preset(path) converts with its weights, trains with PipelineModel.fit on the project's synthetic text at its real dropout (loss falling), resumes from a checkpoint exactly, and exports a SavedModel whose outputs equal the Keras model given the fine-tuned weights (docs/keras.md, "Pretrained weights")."""

import os

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import keras_hub  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import synthetic_text  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import keras_model  # pylint: disable=g-import-not-at-top
from tools.export import main as export  # pylint: disable=g-import-not-at-top

_VOCAB, _SEQ = 24, 12


def _Batches(num_examples=32, batch=8):
  """({'token_ids', 'padding_mask'}, labels) batches of the project's
  synthetic arithmetic sequences (ids 0..2 reserved, 0 = padding)."""
  source = synthetic_text.SyntheticTokenInput.Params().Set(
      name='text', vocab_size=_VOCAB, seq_len=_SEQ, min_length=8,
      num_examples=num_examples, batch_size=batch,
      repeat=False).Instantiate()

  def _Keras(example):
    mask = tf.cast(1.0 - example['paddings'], tf.int32)
    return ({'token_ids': example['ids'], 'padding_mask': mask},
            example['labels'])
  return source.GetDataset().map(_Keras)


def _TokenLoss(labels, logits):
  """Per-example cross-entropy over the unpadded positions (label 0 is
  padding)."""
  ce = keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                    from_logits=True)
  keep = tf.cast(labels > 0, ce.dtype)
  return tf.reduce_sum(ce * keep, -1) / tf.maximum(tf.reduce_sum(keep, -1), 1)


def _Model(params):
  model = keras_model.PipelineModel(
      pipeline.PipeliningLayer.Params().Set(
          name='net', layers=params, num_partitions=2, num_micro_batches=2,
          schedule='1f1b', remat='always'), seed=3)
  model.compile(keras.optimizers.Adam(1e-2), loss=_TokenLoss)
  return model


class KerasHubFinetuneTest(tf.test.TestCase):

  def testPresetFinetuneResumeExport(self):
    preset = os.path.join(self.get_temp_dir(), 'gpt2_tiny')
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=_VOCAB, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=_SEQ)  # dropout 0.1
    keras_hub.models.GPT2CausalLM(
        backbone=backbone, preprocessor=None).save_to_preset(preset)

    lm = keras_hub.models.GPT2CausalLM.from_preset(preset, preprocessor=None)
    self.assertEqual(lm.backbone.dropout, 0.1)
    params = pipeline.FromKeras(lm)
    model = _Model(params)
    pairs = pipeline.LoadKerasWeights(model.layer, lm)
    self.assertLen(pairs, len(lm.weights))
    for keras_var, var in pairs:  # The preset's weights, not fresh ones.
      self.assertAllEqual(keras_var.numpy(), var.numpy())

    history = model.fit(_Batches(), epochs=3, verbose=0)
    losses = history.history['loss']
    self.assertEqual(losses, sorted(losses, reverse=True))  # Falling.
    self.assertLess(losses[-1], 0.9 * losses[0], losses)

    # Resume: a checkpoint after 3 epochs restored into a fresh model takes
    # the same next epoch (weights, optimizer slots, dropout seeds).
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = ckpt.save(os.path.join(self.get_temp_dir(), 'ckpt'))
    model.fit(_Batches(), epochs=1, verbose=0)
    resumed = _Model(params)
    resumed.optimizer.build(resumed.layer.trainable_variables)
    tf.train.Checkpoint(model=resumed,
                        optimizer=resumed.optimizer).restore(
                            path).assert_existing_objects_matched()
    resumed.fit(_Batches(), epochs=1, verbose=0)
    for a, b in zip(model.layer.trainable_variables,
                    resumed.layer.trainable_variables):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6, msg=a.name)

    # Export: the SavedModel serves what the Keras model computes with the
    # fine-tuned weights.
    for keras_var, var in pairs:  # Pipeline -> Keras.
      keras_var.assign(var)
    export_dir = os.path.join(self.get_temp_dir(), 'export')
    export.ExportLayer(model.layer, {
        'padding_mask': tf.TensorSpec([None, None], tf.int32),
        'token_ids': tf.TensorSpec([None, None], tf.int32)}, export_dir)
    serve = tf.saved_model.load(export_dir).signatures['serving_default']
    x, _ = next(iter(_Batches()))
    got = serve(**x)['outputs']
    self.assertAllClose(lm(x, training=False), got, rtol=1e-5, atol=1e-5)
    self.assertNotAllClose(
        keras_hub.models.GPT2CausalLM.from_preset(
            preset, preprocessor=None)(x, training=False), got)


if __name__ == '__main__':
  tf.test.main()
