"""Tests of gpipe_tf.train.keras_model: model.fit on a pipeline equals hand-written steps."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import os  # pylint: disable=g-import-not-at-top,g-bad-import-order
import shutil
import tempfile

from absl.testing import parameterized
import keras
import numpy as np
import tensorflow as tf

from gpipe_tf import pipeline
from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.train import keras_model

SCHEDULES = ('gpipe', '1f1b')
BATCH = 16
LEARNING_RATE = 0.03


def _Data(num, seed):
  """(x, y) of the 8-layer test MLP (6 inputs, 5 classes), a fixed teacher."""
  rng = np.random.RandomState(seed)
  x = rng.randn(num, 6).astype(np.float32)
  teacher = np.random.RandomState(0).randn(6, 5)
  return x, np.argmax(x @ teacher, axis=-1).astype(np.int32)


def _Dataset(num, seed):
  return tf.data.Dataset.from_tensor_slices(_Data(num, seed)).batch(BATCH)


def _Pipeline(schedule):
  return PipeliningLayer.Params().Set(
      name='net', layers=test_utils.MlpLayers(), num_partitions=2,
      num_micro_batches=2, schedule=schedule)


def _Sequential():
  return core.SequentialLayer.Params().Set(name='net',
                                           layers=test_utils.MlpLayers())


def _Compiled(params):
  model = keras_model.PipelineModel(params)
  model.compile(keras.optimizers.Adam(LEARNING_RATE),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=['accuracy'])
  return model


def _Values(model):
  return [v.numpy() for v in model.layer.variables]


class PipelineModelFitTest(tf.test.TestCase, parameterized.TestCase):
  """One fit per schedule with TensorBoard, ModelCheckpoint, EarlyStopping."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.train = _Dataset(96, seed=1)
    cls.test = _Dataset(40, seed=2)  # 16 + 16 + 8: an uneven last batch.
    cls.runs = {}
    for schedule in SCHEDULES:
      directory = os.path.join(cls.root, schedule)
      model = _Compiled(_Pipeline(schedule))
      early_stopping = keras.callbacks.EarlyStopping(
          monitor='val_loss', min_delta=10.0, patience=1)  # Never so fast.
      history = model.fit(
          cls.train, validation_data=cls.test, epochs=6, verbose=0,
          callbacks=[
              keras.callbacks.TensorBoard(os.path.join(directory, 'tb')),
              keras.callbacks.ModelCheckpoint(
                  os.path.join(directory, 'epoch{epoch}.weights.h5'),
                  save_weights_only=True),
              early_stopping])
      cls.runs[schedule] = (model, history.history, early_stopping, directory)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  @parameterized.parameters(*SCHEDULES)
  def testLossGoesDownAndEarlyStoppingStopped(self, schedule):
    _, history, early_stopping, _ = self.runs[schedule]
    self.assertLen(history['loss'], 2)  # EarlyStopping ended 6 epochs at 2.
    self.assertEqual(early_stopping.stopped_epoch, 1)
    self.assertLess(history['loss'][1], 0.95 * history['loss'][0])
    self.assertLess(history['val_loss'][1], history['val_loss'][0])
    self.assertContainsSubset({'accuracy', 'val_accuracy'}, set(history))

  # The two checks that step the pipeline again each take one of the two
  # fits (PipelineModel runs any schedule through the same
  # ComputeLossAndGradients or FProp call; that each schedule computes the
  # same numbers is schedule_transparency_test's and support_test's): half
  # the steps to trace, every fit still checked against a truth.
  def testUpdatesEqualHandWrittenSteps(self):
    schedule = '1f1b'
    model, history, _, _ = self.runs[schedule]
    net = _Pipeline(schedule).Instantiate()
    optimizer = keras.optimizers.Adam(LEARNING_RATE)

    def _LossTerms(outputs, labels):
      return loss_lib.LossTerms(keras.losses.sparse_categorical_crossentropy(
          labels, outputs, from_logits=True))

    @tf.function
    def _Step(x, y):
      loss, _, grads = net.ComputeLossAndGradients(x, y, _LossTerms)
      optimizer.apply_gradients(zip(grads, net.trainable_variables))
      return loss

    losses = []
    for _ in range(len(history['loss'])):
      losses.append([float(_Step(x, y)) for x, y in self.train])
    for got, want in zip(_Values(model), [v.numpy() for v in net.variables]):
      self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
    # Keras's epoch loss: the mean over the epoch's (equal) batches.
    self.assertAllClose(history['loss'], np.mean(losses, axis=1), rtol=1e-5)

  def testEvaluateAndPredictEqualSequentialLayer(self):
    schedule = 'gpipe'
    model = self.runs[schedule][0]
    path = os.path.join(tempfile.mkdtemp(dir=self.root), 'w.weights.h5')
    model.save_weights(path)
    sequential = _Compiled(_Sequential())
    sequential.load_weights(path)  # Same variable paths.
    # One evaluate of the pipeline, checked against both truths.
    loss, accuracy = model.evaluate(self.test, verbose=0)
    self.assertAllClose([loss, accuracy],
                        sequential.evaluate(self.test, verbose=0), rtol=1e-5)
    x, y = _Data(40, seed=2)
    logits = model.predict(self.test, verbose=0)
    self.assertAllClose(logits, sequential.predict(self.test, verbose=0),
                        rtol=1e-5, atol=1e-6)
    # And evaluate's numbers are the loss and accuracy of those logits.
    log_probs = test_utils.LogSoftmax(logits)
    self.assertAllClose(loss, -np.mean(log_probs[np.arange(40), y]),
                        rtol=1e-5)
    self.assertAllClose(accuracy, np.mean(np.argmax(logits, -1) == y))
    del x

  @parameterized.parameters(*SCHEDULES)
  def testTensorBoardWroteEpochScalars(self, schedule):
    tb = os.path.join(self.runs[schedule][3], 'tb')
    for split, tag in (('train', 'epoch_loss'),
                       ('validation', 'epoch_accuracy')):
      self.assertEqual(sorted(test_utils.Scalars(os.path.join(tb, split))[tag]),
                       [0, 1])

  @parameterized.parameters(*SCHEDULES)
  def testModelCheckpointLoadsBack(self, schedule):
    model, _, _, directory = self.runs[schedule]
    self.assertEqual(sorted(f for f in os.listdir(directory)
                            if f.endswith('.h5')),
                     ['epoch1.weights.h5', 'epoch2.weights.h5'])
    fresh = keras_model.PipelineModel(_Pipeline(schedule))
    self.assertNotAllClose(_Values(fresh)[0], _Values(model)[0])
    fresh.load_weights(os.path.join(directory, 'epoch2.weights.h5'))
    for got, want in zip(_Values(fresh), _Values(model)):
      self.assertAllEqual(got, want)


def _KerasCnn():
  return keras.Sequential([
      keras.Input((8, 8, 1)),
      keras.layers.Conv2D(8, 3, padding='same', activation='relu'),
      keras.layers.BatchNormalization(),
      keras.layers.Conv2D(8, 3, strides=2, padding='same', activation='relu'),
      keras.layers.Dropout(0.1),
      keras.layers.Flatten(),
      keras.layers.Dense(4)])


def _KerasTransformer(num_blocks=2, dim=16, length=6, vocab=12):
  """Pre-norm Transformer blocks (keras.layers.MultiHeadAttention)."""
  ids = keras.Input((length,), dtype='int32')
  h = keras.layers.Embedding(vocab, dim)(ids)
  for _ in range(num_blocks):
    a = keras.layers.LayerNormalization()(h)
    a = keras.layers.MultiHeadAttention(2, dim // 2)(a, a)
    h = keras.layers.Add()([h, a])
    f = keras.layers.LayerNormalization()(h)
    f = keras.layers.Dense(2 * dim, activation='relu')(f)
    f = keras.layers.Dense(dim)(f)
    h = keras.layers.Add()([h, f])
  return keras.Model(ids, keras.layers.Dense(vocab)(h))


class FromKerasFitTest(tf.test.TestCase):
  """Keras models through pipeline.FromKeras, trained by PipelineModel.fit."""

  def _FitFromKeras(self, keras_net, x, y):
    layers = pipeline.FromKeras(keras_net)
    model = keras_model.PipelineModel(PipeliningLayer.Params().Set(
        name='net', layers=layers, num_partitions=2, num_micro_batches=2,
        schedule='1f1b', input_shapes=layers[0].input_shapes))
    pipeline.LoadKerasWeights(model.layer, keras_net)
    self.assertLen(model.layer.balance, 2)
    # 60 examples: an uneven last batch, so Keras traces the step with an
    # unknown batch dimension (Dense kernel gradients on 3-D inputs then have
    # static shape (None, units)).
    data = tf.data.Dataset.from_tensor_slices((x[:60], y[:60])).batch(BATCH)
    # Before training, the pipelined forward is the Keras model's.
    self.assertAllClose(model.predict(data, verbose=0),
                        keras_net.predict(data, verbose=0), rtol=1e-5,
                        atol=1e-5)
    model.compile(keras.optimizers.Adam(LEARNING_RATE),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=['accuracy'])
    return model.fit(data, epochs=3, verbose=0).history['loss']

  def testKerasCnnTrains(self):
    rng = np.random.RandomState(0)
    x = rng.randn(64, 8, 8, 1).astype(np.float32)
    y = (x[:, :4, :4].mean(axis=(1, 2, 3)) > 0).astype(np.int32) + 2 * (
        x[:, 4:, 4:].mean(axis=(1, 2, 3)) > 0).astype(np.int32)
    losses = self._FitFromKeras(_KerasCnn(), x, y)
    self.assertLess(losses[-1], 0.8 * losses[0])

  def testKerasTransformerBlocksTrain(self):
    ids = np.random.RandomState(0).randint(0, 12, (64, 6)).astype(np.int32)
    # One block: every kind of layer (embedding, layer norm, attention,
    # residual adds) crosses the cut; a second block repeats them.
    losses = self._FitFromKeras(_KerasTransformer(num_blocks=1), ids,
                                ids[:, ::-1])
    self.assertLess(losses[-1], 0.9 * losses[0])


class AuxLossFitTest(tf.test.TestCase):

  def testAddLossIsInTheLossAndTheUpdateAsInKeras(self):
    # Layers that add losses with add_loss (one per cell): the loss one
    # training step reports and the weights after it are Keras's own step's
    # (SGD, M=1), pipelined (the loss inside) and in a SequentialLayer (the
    # tape).
    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 6).astype(np.float32), rng.randn(8, 3)
    want_net = test_utils.KerasAuxLossModel()
    want_net.compile(keras.optimizers.SGD(0.5), 'mse')
    want_loss = want_net.train_on_batch(x, y)
    for pipelined in (True, False):
      with self.subTest(pipelined=pipelined):
        keras_net = test_utils.KerasAuxLossModel()
        layers = pipeline.FromKeras(keras_net)
        model = keras_model.PipelineModel(
            PipeliningLayer.Params().Set(
                name='net', layers=layers, num_partitions=2,
                num_micro_batches=1, schedule='1f1b') if pipelined else
            core.SequentialLayer.Params().Set(name='net', layers=layers))
        pairs = dict((id(k), v) for k, v in
                     pipeline.LoadKerasWeights(model.layer, keras_net))
        model.compile(keras.optimizers.SGD(0.5), 'mse')
        plain = float(np.mean((keras_net.predict(x, verbose=0) - y)**2))
        loss = model.train_on_batch(x, y)
        self.assertGreater(loss - plain, 0.05)  # The terms count.
        self.assertAllClose(want_loss, loss, rtol=1e-5)
        for want, mine in zip(want_net.weights, keras_net.weights):
          self.assertAllClose(want.numpy(), pairs[id(mine)].numpy(),
                              rtol=1e-5, atol=1e-6)


class PipelineModelErrorsTest(tf.test.TestCase):

  def testAnOpErrorAsFitRunsNamesItsActions(self):
    # A NaN in the third of 4 micro-batches fails the last stage's
    # check_numerics in one of its FB actions (pipeline/run_errors.py); the
    # error keeps its type.
    layers = test_utils.MlpLayers()
    model = _Compiled(PipeliningLayer.Params().Set(
        name='net', layers=layers[:4] + [test_utils.NoNaN.Params().Set(
            name='check')] + layers[4:], num_partitions=2,
        num_micro_batches=4, schedule='1f1b', balance=[4, 5]))
    x, y = _Data(BATCH, seed=1)
    x[9, 0] = np.nan  # Micro-batch 2 of 4 (4 examples each).
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      model.fit(data, epochs=1, verbose=0)
    self.assertIn('InvalidArgumentError in one of 4 actions, FB of stage 1 on '
                  'micro-batch 0, 1, 2 or 3', str(raised.exception))
    self.assertIn(action_lib.Action('FB', 1, 2),
                  raised.exception.where.actions)
    # evaluate runs the forward (F actions only).
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      model.evaluate(data, verbose=0)
    self.assertIn('InvalidArgumentError in one of 4 actions, F of stage 1 on '
                  'micro-batch 0, 1, 2 or 3', str(raised.exception))

  def _Model(self):
    return keras_model.PipelineModel(_Sequential())

  def testRefusedCompileArguments(self):
    cases = [
        (dict(loss=None), 'needs a loss'),
        (dict(loss=keras.losses.MeanSquaredError(reduction='sum')),
         "reduction='sum_over_batch_size'"),
        (dict(loss=keras.losses.MeanSquaredError(reduction=None)),
         "reduction='sum_over_batch_size'"),
        (dict(loss={'a': 'mse'}), 'single loss'),
        (dict(loss='mse', metrics=[keras.metrics.AUC()]), 'per-example'),
        (dict(loss='mse', loss_weights=[1.0]), 'loss_weights'),
        (dict(loss='mse', jit_compile=True), 'jit_compile'),
    ]
    for kwargs, message in cases:
      with self.subTest(kwargs=repr(kwargs)):
        with self.assertRaisesRegex(keras_model.KerasLossError, message):
          self._Model().compile('adam', **kwargs)

  def testScalarLossAndSampleWeightsRefusedAtFit(self):
    x, y = _Data(32, seed=1)
    model = self._Model()
    model.compile('adam', loss=lambda y, p: tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True)))
    with self.assertRaisesRegex(keras_model.KerasLossError,
                                'one value per example'):
      model.fit(x, y, batch_size=BATCH, verbose=0)
    model = self._Model()
    model.compile('adam', loss='sparse_categorical_crossentropy')
    with self.assertRaisesRegex(keras_model.KerasLossError, 'sample weights'):
      model.fit(x, y, sample_weight=np.ones(32), batch_size=BATCH, verbose=0)

  def testWeightsOfAnotherModelRefused(self):
    path = os.path.join(tempfile.mkdtemp(), 'w.weights.h5')
    self._Model().save_weights(path)
    other = keras_model.PipelineModel(core.SequentialLayer.Params().Set(
        name='net', layers=test_utils.MlpLayers()[:4]))
    # Keras's loader wraps the IncompatibleCheckpointError in a ValueError.
    with self.assertRaisesRegex(ValueError, 'holds another model'):
      other.load_weights(path)
