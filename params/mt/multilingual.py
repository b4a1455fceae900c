"""Multilingual Transformer T(L, H, A) translation experiments of the paper's section 5.

``mt.multilingual.T_<L>_<H>_<A>``: L encoder and L decoder layers,
feed-forward size H, A attention heads (64 channels each), model dimension
1024, a 64k subword vocabulary shared by all languages, with a '<2xx>'
target-language token starting each source (gpipe_tf.data.text_inputs):

  experiment        params (built, untied softmax)   K    M
  T_6_8192_16       408M  (paper: 400M)              1    1
  T_24_8192_16      1.24B (paper: 1.3B)              4    16
  T_12_16384_32     1.24B (paper: 1.3B)              2    8
  T_32_16384_32     3.09B (paper: 3B)                8    32
  T_64_16384_32     6.04B (paper: 6B)                16   64

K follows the paper ("T(12,16384,32), T(24,8192,32), T(32,16384,32) and
T(64,16384,32) are partitioned over 2, 4, 8 and 16 accelerators"; its
T(24,8192,32) is read as the T(24,8192,16) named everywhere else). The paper
gives no K for the 400M Transformer Big, which fits one accelerator: K = 1
without micro-batching. M = 4K, where the paper finds the bubble negligible.

Data: the paper's 102-languages-to-English corpus is internal. Train() and
Test() read parallel text files {split}.{src}-{tgt}.{lang} from DATA_FOLDER
(every language pair found; the vocabulary is built there on first use);
point it elsewhere with ``--model_params_override="train.folder : '/path';
test.folder : '/path'"`` or a subclass. Sentences are truncated to
MAX_LENGTH = 128 tokens and padded to it.

Training: Adam (0.9, 0.98), Transformer warm-up and rsqrt decay, label
smoothing 0.1, dropout 0.1, and the paper's stabilisers: feed-forward
initialisation scaled down by the number of layers and logits clipped.
Shrink a model by subclassing and overriding the class attributes.
"""

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.tasks import sequence
from gpipe_tf.data import text_inputs
from gpipe_tf.models import transformer
from gpipe_tf.pipeline import PipeliningLayer


class TransformerMTBase(base_experiment.SingleTaskModelParams):
  """T(L, H, A) on a folder of parallel text; subclasses set L, H, A and K."""

  NUM_LAYERS = 6
  HIDDEN_DIM = 8192
  NUM_HEADS = 16
  MODEL_DIM = 1024
  ATTEN_DIM_PER_HEAD = 64
  VOCAB_SIZE = 64000
  MAX_LENGTH = 128
  BATCH_SIZE = 256
  NUM_PARTITIONS = 1
  NUM_MICRO_BATCHES = 1
  REMAT = 'never'
  DROPOUT_PROB = 0.1
  LABEL_SMOOTHING = 0.1
  LOGITS_CLIP = 20.0
  LEARNING_RATE = 1e-3
  WARMUP_STEPS = 4000
  DATA_FOLDER = 'data/multilingual'

  def _Input(self, split: str):
    return text_inputs.ParallelTextInput.Params().Set(
        name=split, folder=self.DATA_FOLDER, split=split, build_vocab=True,
        vocab_split='train', vocab_size=self.VOCAB_SIZE,
        max_length=self.MAX_LENGTH, truncate=True, batch_size=self.BATCH_SIZE)

  def Train(self):
    return self._Input('train').Set(shuffle=True, repeat=True, seed=1)

  def Test(self):
    return self._Input('test').Set(shuffle=False, repeat=False)

  def Task(self):
    layers = transformer.TransformerNMT(
        self.NUM_LAYERS, self.HIDDEN_DIM, self.NUM_HEADS, self.MODEL_DIM,
        self.VOCAB_SIZE, atten_dim_per_head=self.ATTEN_DIM_PER_HEAD,
        max_seq_len=self.MAX_LENGTH, dropout_prob=self.DROPOUT_PROB,
        atten_dropout_prob=self.DROPOUT_PROB,
        relu_dropout_prob=self.DROPOUT_PROB, logits_clip=self.LOGITS_CLIP)
    model = PipeliningLayer.Params().Set(
        name='nmt', layers=layers, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, remat=self.REMAT,
        input_shapes=transformer.NMTInputShapes(self.MAX_LENGTH,
                                                self.MAX_LENGTH))
    p = sequence.TranslationTask.Params().Set(
        model=model, label_smoothing=self.LABEL_SMOOTHING, random_seed=1)
    p.optimizer = optimizers.Adam.Params().Set(beta1=0.9, beta2=0.98,
                                               epsilon=1e-9)
    p.learning_rate_schedule = lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
        learning_rate=self.LEARNING_RATE, warmup_steps=self.WARMUP_STEPS)
    return p


@model_registry.RegisterSingleTaskModel
class T_6_8192_16(TransformerMTBase):  # pylint: disable=invalid-name
  """The 400M Transformer Big baseline, on one accelerator."""


class _Pipelined(TransformerMTBase):
  REMAT = 'except_last'


@model_registry.RegisterSingleTaskModel
class T_24_8192_16(_Pipelined):  # pylint: disable=invalid-name
  """1.3B deep model on 4 accelerators."""
  NUM_LAYERS = 24
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 16


@model_registry.RegisterSingleTaskModel
class T_12_16384_32(_Pipelined):  # pylint: disable=invalid-name
  """1.3B wide model on 2 accelerators."""
  NUM_LAYERS = 12
  HIDDEN_DIM = 16384
  NUM_HEADS = 32
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 8


@model_registry.RegisterSingleTaskModel
class T_32_16384_32(T_12_16384_32):  # pylint: disable=invalid-name
  """3B model on 8 accelerators."""
  NUM_LAYERS = 32
  NUM_PARTITIONS = 8
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class T_64_16384_32(T_12_16384_32):  # pylint: disable=invalid-name
  """6B model on 16 accelerators."""
  NUM_LAYERS = 64
  NUM_PARTITIONS = 16
  NUM_MICRO_BATCHES = 64
