"""Transformer-L language models of the paper's Table 1 on synthetic token sequences.

``lm.synthetic.TransformerL_<L>`` for L in 3, 13, 103, 415, 1663: model
dimension 2048, feed-forward 8192, 32 heads, vocabulary 32000, sequence
length 1024, batch 32 sequences, RMSProp (12 bytes per parameter: the weight,
its mean square and its momentum), partitioned as Table 1's columns:

  L      params   Table 1 column   K    M    remat
  3      282.2M   Naive-1          1    1    never
  13     785.8M   Pipeline-1       1    32   except_last
  103    5.3B     Pipeline-8       8    32   except_last
  415    21.0B    Pipeline-32      32   32   except_last
  1663   83.9B    Pipeline-128     128  32   except_last

M = 32 cuts the batch of 32 into single sequences: these are the paper's
largest-model-that-fits experiments, where the micro-batch size sets the
activation memory. The data are noisy arithmetic token sequences
(synthetic_text.SyntheticTokenInput); the paper reports no LM quality here.

Shrink a model for a laptop by subclassing and overriding the class
attributes (NUM_LAYERS, MODEL_DIM, ...); `--model_params_override` edits the
built Params, e.g. ``model.num_micro_batches : 8`` or ``train.batch_size : 8``.
"""

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.data import synthetic_text
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.tasks import sequence
from gpipe_tf.models import transformer
from gpipe_tf.pipeline import PipeliningLayer


class TransformerLBase(base_experiment.SingleTaskModelParams):
  """Transformer-L on synthetic tokens; subclasses set NUM_LAYERS and K."""

  NUM_LAYERS = 3
  MODEL_DIM = 2048
  HIDDEN_DIM = 8192
  NUM_HEADS = 32
  VOCAB_SIZE = 32000
  SEQ_LEN = 1024
  BATCH_SIZE = 32
  NUM_PARTITIONS = 1
  NUM_MICRO_BATCHES = 1
  REMAT = 'never'
  DROPOUT_PROB = 0.0
  LOGITS_CLIP = 20.0
  LEARNING_RATE = 1e-4
  WARMUP_STEPS = 1000
  NUM_EXAMPLES = 256

  def _Input(self, data_seed: int):
    return synthetic_text.SyntheticTokenInput.Params().Set(
        vocab_size=self.VOCAB_SIZE, seq_len=self.SEQ_LEN,
        num_examples=self.NUM_EXAMPLES, noise=0.05, data_seed=data_seed,
        batch_size=self.BATCH_SIZE)

  def Train(self):
    return self._Input(data_seed=1).Set(name='train', shuffle=True,
                                        repeat=True, seed=1)

  def Test(self):
    return self._Input(data_seed=2).Set(name='test', shuffle=False,
                                        repeat=False)

  def Task(self):
    layers = transformer.TransformerLM(
        self.NUM_LAYERS, self.MODEL_DIM, self.HIDDEN_DIM, self.NUM_HEADS,
        self.VOCAB_SIZE, max_seq_len=self.SEQ_LEN,
        dropout_prob=self.DROPOUT_PROB, logits_clip=self.LOGITS_CLIP)
    model = PipeliningLayer.Params().Set(
        name='lm', layers=layers, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, remat=self.REMAT,
        input_shapes=transformer.LMInputShapes(self.SEQ_LEN))
    p = sequence.LanguageModelTask.Params().Set(model=model,
                                                      random_seed=1)
    p.optimizer = optimizers.RMSProp.Params().Set(decay=0.9, momentum=0.9,
                                                  epsilon=1e-6)
    p.learning_rate_schedule = lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
        learning_rate=self.LEARNING_RATE, warmup_steps=self.WARMUP_STEPS)
    p.clip_gradient_norm_to_value = 1.0
    return p


@model_registry.RegisterSingleTaskModel
class TransformerL_3(TransformerLBase):  # pylint: disable=invalid-name
  """282.2M parameters, one accelerator without GPipe (Naive-1)."""
  NUM_LAYERS = 3


@model_registry.RegisterSingleTaskModel
class TransformerL_13(TransformerLBase):  # pylint: disable=invalid-name
  """785.8M parameters, one accelerator with GPipe (Pipeline-1)."""
  NUM_LAYERS = 13
  NUM_MICRO_BATCHES = 32
  REMAT = 'except_last'


@model_registry.RegisterSingleTaskModel
class TransformerL_103(TransformerL_13):  # pylint: disable=invalid-name
  """5.3B parameters on 8 accelerators (Pipeline-8)."""
  NUM_LAYERS = 103
  NUM_PARTITIONS = 8


@model_registry.RegisterSingleTaskModel
class TransformerL_415(TransformerL_13):  # pylint: disable=invalid-name
  """21.0B parameters on 32 accelerators (Pipeline-32)."""
  NUM_LAYERS = 415
  NUM_PARTITIONS = 32


@model_registry.RegisterSingleTaskModel
class TransformerL_1663(TransformerL_13):  # pylint: disable=invalid-name
  """83.9B parameters on 128 accelerators (Pipeline-128)."""
  NUM_LAYERS = 1663
  NUM_PARTITIONS = 128
