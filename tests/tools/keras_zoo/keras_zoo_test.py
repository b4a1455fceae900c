"""tools.keras_zoo: a keras_hub task model pipelined equals Keras's own step within float32 rounding (its verdict against the float64 truth), and at its own dropout the unpipelined step under the same seeds; the zoo has a row for every keras_hub backbone class.

GPT2CausalLM (a backbone called with a dict of two inputs, a tied
embedding read again by the output head) under 1f1b at K=2 equals Keras's
tf.GradientTape step within float32 rounding: its verdict against Keras's
float64 step is 'exact' (keras_zoo_table_test: the verdict flags a
gradient off by more than rounding). BatchNorm, operation nodes and
custom-gradient activations of the keras.applications models are covered
at a smaller size by tests/pipeline/keras_import_test.py.
"""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools.keras_zoo import main as keras_zoo  # pylint: disable=g-import-not-at-top
from tools.keras_zoo import hub as keras_zoo_hub  # pylint: disable=g-import-not-at-top
from tools.keras_zoo import table as keras_zoo_table  # pylint: disable=g-import-not-at-top


class KerasZooTest(tf.test.TestCase):

  def testHubModelEqualsKeras(self):
    # A keras_hub task model (a nested backbone called with a dict, tied
    # embeddings, padding masks with padded tokens) through the zoo's own
    # path; several outputs and the rest are keras_import_test's.
    [row] = keras_zoo.Run('GPT2CausalLM', [(2, '1f1b')], micro_batches=2)
    self.assertEqual(row.status, 'converted', row.detail)
    self.assertLess(row.max_grad_diff, 1e-5)
    self.assertEqual(keras_zoo_table.Verdict(row), 'exact')
    # The truth is float64: Keras's own float32 step is off it, a little.
    self.assertBetween(row.keras_error, 1e-9, 1e-5)
    # At GPT-2's own dropout 0.1, pipelined (remat always) equals
    # unpipelined under the same step seed.
    self.assertIsNotNone(row.seeded_diff)
    self.assertLess(row.seeded_diff, 1e-5)

  def testMoeModelIsJudgedAgainstKerasOwnStepInAnotherOrder(self):
    # keras_hub's MoE block casts to float32 inside, so Keras cannot step
    # its float64 twin; it adds its router loss per micro-batch, so the
    # truth is Keras's float32 step over the same micro-batches summed in
    # reverse order, and the same verdict holds against it.
    self.assertEqual(keras_zoo_hub.Build(
        'QwenMoeBackbone').router_aux_loss_coefficient, 0.001)  # Its own.
    [row] = keras_zoo.Run('QwenMoeBackbone', [(2, 'gpipe')], micro_batches=2)
    self.assertEqual(row.status, 'converted', row.detail)
    self.assertEqual(row.truth, keras_zoo_table.F32_REVERSED)
    self.assertLess(row.keras_error, 1e-5)
    self.assertEqual(keras_zoo_table.Verdict(row), 'exact')

  _moe = None  # One MoE model for both router-loss tests (a keras_hub build).

  def _Moe(self):
    # Built once: the steps read the model's weights and never change them.
    if KerasZooTest._moe is None:
      import keras_hub  # pylint: disable=g-import-not-at-top
      from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
      # A coefficient large enough that the router loss moves the gradients.
      # One decoder layer (with two both tests took ~2.5x the CPU): the
      # balance [3, 1] below puts it in the first cell, so its router loss is
      # carried through the second to the loss.
      model = keras_hub.models.QwenMoeBackbone(
          vocabulary_size=50, num_layers=1, num_query_heads=2,
          num_key_value_heads=1, hidden_dim=16, intermediate_dim=32,
          moe_intermediate_dim=16, shared_expert_intermediate_dim=16,
          num_experts=4, top_k=2, router_aux_loss_coefficient=0.5)
      x = keras_zoo._Inputs(model, 8)  # pylint: disable=protected-access
      targets = tf.random.stateless_normal([8, keras_zoo_hub.SEQ, 16],
                                           [7, 7])
      KerasZooTest._moe = (model, pipeline.FromKeras(model), x, targets)
    return KerasZooTest._moe

  def _AssertRouterLossCarried(self, m, schedules):
    model, params, x, targets = self._Moe()
    loss, want = keras_zoo.KerasStep(model, x, targets, m)
    plain = tf.reduce_mean(keras_zoo.SquaredError(model(x), targets))
    self.assertGreater(float(loss - plain), 1e-3)  # The router loss counts.
    for schedule in schedules:
      with self.subTest(schedule=schedule):
        # Cell 0: inputs, token_embedding, transformer_layer_0.
        _, got_loss, got = keras_zoo.PipelineStep(
            model, params, x, targets, m, num_partitions=2,
            schedule=schedule, balance=[3, 1])
        self.assertAllClose(loss, got_loss, rtol=1e-6)
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testMoeRouterLossIsInTheLossAsInKerasStep(self):
    # At M=1 the pipelined step is Keras's (loss + model.losses). One
    # schedule: at M=1 every schedule runs F0 F1 B1 B0, and
    # aux_carry_test.testEqualsKerasStepAtOneMicroBatch runs gpipe, 1f1b and
    # zb_h1 at M=1 on a smaller model.
    self._AssertRouterLossCarried(1, ('gpipe',))

  def testMoeRouterLossIsPerMicroBatch(self):
    # At M=4 each micro-batch's router loss is its own, weighed 1/4
    # (aux_carry_test covers every schedule at both M on a smaller model).
    self._AssertRouterLossCarried(4, ('zb_h1',))

  def testEveryHubBackboneHasARow(self):
    import inspect  # pylint: disable=g-import-not-at-top
    import keras_hub  # pylint: disable=g-import-not-at-top
    backbones = {n for n in dir(keras_hub.models) if n.endswith('Backbone')
                 and inspect.isclass(getattr(keras_hub.models, n))}
    names = set(keras_zoo_hub.Names())
    self.assertEqual(backbones - names, {'Backbone', 'FeaturePyramidBackbone'})
    self.assertContainsSubset(set(keras_zoo_hub.TASKS), names)
    # A composite backbone gets tiny sub-models; a class the zoo does not
    # build says why.
    clip = keras_zoo_hub.Build('CLIPBackbone')
    self.assertEqual(clip.vision_encoder.hidden_dim, 16)
    self.assertEqual(clip.text_encoder.max_sequence_length, keras_zoo_hub.SEQ)
    with self.assertRaisesRegex(keras_zoo_hub.NotBuiltError,
                                'not built: its smallest build holds'):
      keras_zoo_hub.Build('BASNetBackbone')
    # An input named in LENGTHS gets its length (Moonshine's audio).
    moonshine = keras_zoo_hub.Build('MoonshineBackbone')
    x = keras_zoo._Inputs(moonshine, 2)  # pylint: disable=protected-access
    self.assertEqual(x['encoder_input_values'].shape, [2, 1024, 1])
    self.assertEqual(x['decoder_token_ids'].shape, [2, keras_zoo_hub.SEQ])
    # Not another class's input of the same name (BART's token mask).
    bart = keras_zoo._Inputs(keras_zoo_hub.Build('BartBackbone'), 2)  # pylint: disable=protected-access
    self.assertEqual(bart['encoder_padding_mask'].shape,
                     [2, keras_zoo_hub.SEQ])
    quiet = keras_zoo_hub.Build('BertBackbone')
    self.assertFalse(keras_zoo_hub.HasRandomness(quiet))
    self.assertTrue(keras_zoo_hub.HasRandomness(
        keras_zoo_hub.Build('BertBackbone', randomness=True)))

  def testSam3BoxPromptsIndexTheirOwnMicroBatch(self):
    # A SAM3 box's first number is the row of its image in the call's batch
    # (roi_align gathers there), so each micro-batch of 4 numbers its own
    # images 0-3; labels are 0 or 1 (-10 would be padding). keras_hub's
    # geometry encoder runs only with boxes + 1 = the batch of a call: 3.
    sam3 = keras_zoo_hub.Build('SAM3PromptableConceptBackbone')
    x = keras_zoo._Inputs(sam3, 8)  # pylint: disable=protected-access
    self.assertEqual(x['boxes'].shape, [8, 3, 5])
    self.assertAllEqual(x['boxes'][:, :, 0],
                        [[i % 4] * 3 for i in range(8)])
    self.assertAllInRange(x['boxes'][:, :, 1:], 0.2, 0.6)
    self.assertAllInSet(x['box_labels'], [0, 1])
    for part in (slice(0, 4), slice(4, 8)):  # Keras runs each micro-batch.
      out = sam3(tf.nest.map_structure(lambda t, p=part: t[p], x))
      self.assertEqual(out['pred_boxes'].shape, [4, 8, 4])


if __name__ == '__main__':
  tf.test.main()
