"""Pipelined Transformer translation of a synthetic word-reversal corpus, scored with BLEU.

``mt.reversal.TinyTransformer`` learns to translate 3-8 word sentences over a
24-word lexicon into the same words in reverse order ('rev'), on 2 pipeline
cells (PipeliningLayer, K=2, M=4). The corpus is written offline by the input
generator itself on first use (``text_inputs.WriteReversalCorpus``,
idempotent) into ``DATA_ROOT/<corpus name>`` together with its sentencepiece
vocabulary. ``mt.reversal.TinyMultilingual`` trains one model on two target
languages ('rev' and 'mir', words also spelled backwards) told apart by the
'<2rev>' / '<2mir>' token at the start of the source.

Train, then score the test split with greedy decoding::

  python -m gpipe_tf.trainer --model=mt.reversal.TinyTransformer \\
      --logdir=/tmp/rev --max_steps=600
  python -m params.mt.reversal --model=TinyTransformer --logdir=/tmp/rev

DATA_ROOT is $GPIPE_TF_DATA, else <temp dir>/gpipe_tf_data.
"""

from __future__ import annotations

import os
import tempfile

import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf.train import checkpoints
from gpipe_tf import hyperparams
from gpipe_tf.tasks import metrics
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.tasks import sequence
from gpipe_tf.data import text_inputs
from gpipe_tf.models import transformer
from gpipe_tf.pipeline import PipeliningLayer

DATA_ROOT = os.environ.get('GPIPE_TF_DATA') or os.path.join(
    tempfile.gettempdir(), 'gpipe_tf_data')


class ReversalCorpusInput(text_inputs.ParallelTextInput):
  """ParallelTextInput over a reversal corpus it writes on first use."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('num_train', 20000, 'Training sentence pairs per language.')
    p.Define('num_test', 500, 'Test sentence pairs per language.')
    p.Define('corpus_seed', 0, 'Seed of the corpus sentences.')
    p.Define('languages', ['rev'],
             "Target languages ('rev', 'mir'); the source is 'en'.")
    return p

  def _LoadExamples(self):
    p = self._params
    text_inputs.WriteReversalCorpus(p.folder, p.num_train, p.num_test,
                                    seed=p.corpus_seed,
                                    languages=tuple(p.languages))
    return super()._LoadExamples()


@model_registry.RegisterSingleTaskModel
class TinyTransformer(base_experiment.SingleTaskModelParams):
  """T(2, 256, 4) with 64-wide layers on 2 cells; 'en' -> 'rev' reversal."""

  LANGUAGES = ('rev',)
  NUM_TRAIN = 20000
  NUM_TEST = 500
  VOCAB_SIZE = 256  # An upper bound: the corpus yields fewer pieces.
  MAX_LENGTH = 16
  BATCH_SIZE = 64
  MODEL_DIM = 64
  HIDDEN_DIM = 256
  NUM_HEADS = 4
  NUM_LAYERS = 2
  NUM_MICRO_BATCHES = 4

  def _CorpusFolder(self) -> str:
    name = (f'reversal_{"_".join(self.LANGUAGES)}_{self.NUM_TRAIN}_'
            f'{self.NUM_TEST}')
    return os.path.join(DATA_ROOT, name)

  def _Input(self, split: str) -> hyperparams.Params:
    p = ReversalCorpusInput.Params()
    p.Set(name=split, folder=self._CorpusFolder(), split=split,
          num_train=self.NUM_TRAIN, num_test=self.NUM_TEST,
          languages=list(self.LANGUAGES), build_vocab=True,
          vocab_size=self.VOCAB_SIZE, max_length=self.MAX_LENGTH,
          batch_size=self.BATCH_SIZE)
    return p

  def Train(self):
    p = self._Input('train')
    # Lengths (with <2xx> and </s>) are 5..11 when every word is one piece.
    p.Set(shuffle=True, repeat=True, seed=1, bucket_boundaries=[8, 12])
    return p

  def Test(self):
    p = self._Input('test')
    p.Set(shuffle=False, repeat=False, drop_remainder=False)
    return p

  def Task(self):
    layers = transformer.TransformerNMT(
        num_layers=self.NUM_LAYERS, hidden_dim=self.HIDDEN_DIM,
        num_heads=self.NUM_HEADS, model_dim=self.MODEL_DIM,
        vocab_size=self.VOCAB_SIZE,
        atten_dim_per_head=self.MODEL_DIM // self.NUM_HEADS,
        dropout_prob=0.0, atten_dropout_prob=0.0, relu_dropout_prob=0.0)
    model = PipeliningLayer.Params().Set(
        name='model', layers=layers, num_partitions=2,
        num_micro_batches=self.NUM_MICRO_BATCHES,
        input_shapes=transformer.NMTInputShapes(self.MAX_LENGTH,
                                                self.MAX_LENGTH))
    p = sequence.TranslationTask.Params()
    p.Set(model=model, random_seed=1, clip_gradient_norm_to_value=1.0,
          label_smoothing=0.0)
    p.optimizer = optimizers.Adam.Params().Set(beta2=0.98)
    p.learning_rate_schedule = lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
        learning_rate=3e-3, warmup_steps=100)
    return p


@model_registry.RegisterSingleTaskModel
class TinyMultilingual(TinyTransformer):
  """TinyTransformer trained on 'en' -> 'rev' and 'en' -> 'mir' at once."""

  LANGUAGES = ('rev', 'mir')
  NUM_TRAIN = 10000


def EvaluateBleu(experiment: base_experiment.ExperimentLike, logdir: str,
                 max_batches: int = 0) -> metrics.BleuResult:
  """Greedy-decodes the Test() input with the newest checkpoint of `logdir`.

  Args:
    experiment: the experiment class (or instance, or Params) trained there.
    logdir: the trainer's logdir (checkpoints in logdir/ckpt).
    max_batches: decode at most this many test batches; 0 = all.

  Returns:
    BLEU and exact-match rate of the decoded test split.

  Raises:
    checkpoints.NoCheckpointError: logdir has no checkpoint.
  """
  params = base_experiment.AsExperimentParams(experiment)
  task = params.task.Instantiate()
  restored = checkpoints.Checkpointer(
      os.path.join(logdir, 'ckpt'), tf.train.Checkpoint(task=task),
      strict=('task',)).Restore()
  if restored is None:
    raise checkpoints.NoCheckpointError(
        f'No checkpoint in {logdir}/ckpt; train the experiment first.')
  test = params.test.Copy().Set(repeat=False)
  generator = test.Instantiate()
  max_len = test.max_length
  decode = tf.function(lambda batch: task.Decode(batch, max_len),
                       autograph=False, reduce_retracing=True)
  return metrics.DecodeBleu(decode, generator.GetDataset(), generator.vocab,
                            max_batches=max_batches)


if __name__ == '__main__':
  # An entry point: flags are defined here only, never on import.
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_string('model', 'TinyTransformer', 'Experiment class name.')
  flags.DEFINE_string('logdir', None, 'The trainer logdir to score.')
  flags.DEFINE_integer('num_logical_devices', 2,
                       'Logical CPU devices (the pipeline cells).')
  flags.DEFINE_integer('max_batches', 0, 'Test batches to decode; 0: all.')

  def _Main(argv):
    del argv
    from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
    devices.SplitCpu(flags.FLAGS.num_logical_devices)
    result = EvaluateBleu(globals()[flags.FLAGS.model], flags.FLAGS.logdir,
                          flags.FLAGS.max_batches)
    print(f'BLEU {result.bleu:.2f}  exact match {result.exact_match:.4f}  '
          f'on {len(result.hypotheses)} test sentences')

  flags.mark_flag_as_required('logdir')
  app.run(_Main)
