"""Tests of tools/export/main.py: a trained pipeline's SavedModel, served by a process without gpipe_tf."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import hashlib  # pylint: disable=g-import-not-at-top,g-bad-import-order
import os
import shutil
import subprocess
import sys
import tempfile

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

from gpipe_tf import model_registry
from gpipe_tf.data import synthetic_text
from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.train import checkpoints
from gpipe_tf.train import loop
from params.mt import multilingual
from params.synthetic import mlp
from tools.export import main as export

# Runs in a fresh interpreter: loads both SavedModels with TensorFlow alone
# and writes what their signatures return.
_SERVE = r'''
import sys
import numpy as np
import tensorflow as tf
classifier_dir, translator_dir, inputs_path, out_path = sys.argv[1:]
inputs = dict(np.load(inputs_path))
classify = tf.saved_model.load(classifier_dir).signatures['serving_default']
translator = tf.saved_model.load(translator_dir)
out = {'classify.' + k: v.numpy() for k, v in
       classify(inputs=tf.constant(inputs['inputs'])).items()}
src = {k: tf.constant(inputs[k]) for k in ('src_ids', 'src_paddings')}
tgt = {k: tf.constant(inputs[k]) for k in ('tgt_ids', 'tgt_paddings')}
out['decode.ids'] = translator.signatures['serving_default'](**src)['ids']
out['translate.logits'] = translator.signatures['logits'](**src, **tgt)[
    'logits']
assert 'gpipe_tf' not in sys.modules, 'the SavedModel imported gpipe_tf'
np.savez(out_path, **out)
'''


class _TinyTranslation(multilingual.T_24_8192_16):
  """A pipelined (K=2, M=2) Transformer on synthetic reversal pairs.

  One encoder and one decoder block (6 layers, 3 a cell): a second pair
  cost ~7.5 s more CPU to train, export and check, and nothing the test
  checks depends on their number."""
  NUM_LAYERS = 1
  MODEL_DIM = 8
  HIDDEN_DIM = 16
  NUM_HEADS = 2
  ATTEN_DIM_PER_HEAD = 4
  VOCAB_SIZE = 16
  MAX_LENGTH = 6
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 2
  DROPOUT_PROB = 0.0

  def _Input(self, split):
    return synthetic_text.SyntheticTranslationInput.Params().Set(
        name=split, vocab_size=self.VOCAB_SIZE, src_len=self.MAX_LENGTH,
        tgt_len=self.MAX_LENGTH, num_examples=8, batch_size=4,
        data_seed=1 if split == 'train' else 2)


def _Snapshot(directory):
  """{relative path: sha1} of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), directory)] = (
            hashlib.sha1(f.read()).hexdigest())
  return out


def _Trained(experiment, logdir):
  """The task of `experiment` restored from logdir (pipelined, as trained)."""
  task = experiment().ExperimentParams().task.Instantiate()
  tf.train.Checkpoint(task=task).read(
      tf.train.latest_checkpoint(os.path.join(logdir, 'ckpt'))).expect_partial()
  return task


def _FirstTestBatch(experiment):
  return next(iter(experiment().ExperimentParams().test.Instantiate()
                   .GetDataset()))


def _Run(*args):
  """export.Run on fresh flags parsed from `args`."""
  flag_values = flags.FlagValues()
  export.DefineFlags(flag_values)
  flag_values(['export'] + list(args))
  return export.Run(flag_values)


# One worker runs the whole class, so its setUpClass (two models trained,
# ~15 s of CPU) runs once under `pytest -n 2 --dist loadgroup`.
@pytest.mark.xdist_group('export_test')
class ExportTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.mlp_logdir = os.path.join(cls.root, 'mlp')
    cls.nmt_logdir = os.path.join(cls.root, 'nmt')
    loop.train_and_evaluate(mlp.TinyPipelined, cls.mlp_logdir, 'train', 6)
    loop.train_and_evaluate(_TinyTranslation, cls.nmt_logdir, 'train', 3)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def testServedOutputsEqualTheTrainedPipeline(self):
    before = _Snapshot(self.mlp_logdir), _Snapshot(self.nmt_logdir)
    classifier_dir = os.path.join(self.root, 'classifier')
    translator_dir = os.path.join(self.root, 'translator')
    line = _Run('--model=synthetic.mlp.TinyPipelined',
                f'--logdir={self.mlp_logdir}',
                f'--export_dir={classifier_dir}')
    self.assertEqual(line, f'Exported {self.mlp_logdir}/ckpt/ckpt-6 to '
                     f'{classifier_dir}')
    export.Export(_TinyTranslation, self.nmt_logdir, translator_dir)
    self.assertEqual((_Snapshot(self.mlp_logdir), _Snapshot(self.nmt_logdir)),
                     before)
    for directory in (classifier_dir, translator_dir):
      with open(os.path.join(directory, 'saved_model.pb'), 'rb') as f:
        placed = b'/device:CPU:1' in f.read()
      self.assertFalse(placed, f'{directory} pins ops to the cells\' devices')

    images = _FirstTestBatch(mlp.TinyPipelined)
    pairs = _FirstTestBatch(_TinyTranslation)
    inputs_path = os.path.join(self.root, 'inputs.npz')
    out_path = os.path.join(self.root, 'served.npz')
    np.savez(inputs_path, inputs=images['inputs'].numpy(),
             **{k: v.numpy() for k, v in pairs.items()})
    run = subprocess.run(
        [sys.executable, '-c', _SERVE, classifier_dir, translator_dir,
         inputs_path, out_path], cwd=self.root, capture_output=True,
        text=True, timeout=300, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    served = dict(np.load(out_path))

    classifier = _Trained(mlp.TinyPipelined, self.mlp_logdir)
    self.assertIsInstance(classifier.model, PipeliningLayer)
    logits = classifier.model.FProp(images['inputs'], training=False)
    self.assertAllClose(served['classify.logits'], logits, rtol=1e-5)
    self.assertAllClose(served['classify.probabilities'],
                        tf.nn.softmax(logits), rtol=1e-5)
    translator = _Trained(_TinyTranslation, self.nmt_logdir)
    self.assertIsInstance(translator.model, PipeliningLayer)
    logits = core.AsTuple(translator.model.FProp(
        *translator.ModelInputs(pairs), training=False))[0]
    self.assertAllClose(served['translate.logits'], logits, rtol=1e-5,
                        atol=1e-5)
    self.assertAllEqual(served['decode.ids'],
                        translator.Decode(pairs, max_len=6))

  def testBadInputRaisesNamedErrorsAndTouchesNothing(self):
    before = _Snapshot(self.mlp_logdir)
    full = os.path.join(self.root, 'full')
    os.makedirs(full)
    with open(os.path.join(full, 'keep.txt'), 'w') as f:
      f.write('x')
    model = '--model=synthetic.mlp.TinyPipelined'
    with self.assertRaisesRegex(export.ExportError, 'is not empty'):
      _Run(model, f'--logdir={self.mlp_logdir}', f'--export_dir={full}')
    empty_logdir = os.path.join(self.root, 'never_trained')
    with self.assertRaisesRegex(checkpoints.NoCheckpointError,
                                'No readable checkpoint'):
      _Run(model, f'--logdir={empty_logdir}',
           f'--export_dir={self.root}/out1')
    with self.assertRaises(model_registry.ModelNotFoundError):
      _Run('--model=synthetic.mlp.Tinny', f'--logdir={self.mlp_logdir}',
           f'--export_dir={self.root}/out2')
    with self.assertRaises(checkpoints.IncompatibleCheckpointError):
      _Run('--model=synthetic.mlp.Tiny', f'--logdir={self.mlp_logdir}',
           f'--export_dir={self.root}/out3',
           '--model_params_override=model.layers[0].output_dim : 32; '
           'model.layers[2].input_dim : 32')
    self.assertEqual(_Snapshot(self.mlp_logdir), before)
    self.assertEqual(os.listdir(full), ['keep.txt'])
    self.assertFalse(os.path.exists(empty_logdir))
    for name in ('out1', 'out2', 'out3'):
      self.assertFalse(os.path.exists(os.path.join(self.root, name)))


if __name__ == '__main__':
  tf.test.main()
