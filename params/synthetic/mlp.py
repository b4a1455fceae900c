"""Multi-layer perceptrons on synthetic Gaussian classification data.

``synthetic.mlp.Tiny`` trains in seconds on a CPU and is the trainer's smoke
test: 16-dim inputs labelled by a random linear teacher into 4 classes, a
3-layer MLP with dropout, Adam at a constant rate.
"""

from gpipe_tf import base_experiment
from gpipe_tf.data import inputs
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf import pipeline
from gpipe_tf.tasks import lr_schedules
from gpipe_tf import tasks
from gpipe_tf.layers import core


@model_registry.RegisterSingleTaskModel
class Tiny(base_experiment.SingleTaskModelParams):
  """A 16-64-64-4 MLP; ~80% eval accuracy after 40 steps (chance: 25%)."""

  INPUT_DIM = 16
  HIDDEN_DIM = 64
  NUM_CLASSES = 4
  BATCH_SIZE = 32

  def _Input(self, num_examples: int, data_seed: int):
    p = inputs.SyntheticClassificationInput.Params()
    p.Set(num_examples=num_examples, input_dim=self.INPUT_DIM,
          num_classes=self.NUM_CLASSES, noise=0.05, data_seed=data_seed,
          teacher_seed=0, batch_size=self.BATCH_SIZE)
    return p

  def Train(self):
    p = self._Input(num_examples=512, data_seed=1)
    p.Set(name='train', shuffle=True, repeat=True, seed=1)
    return p

  def Test(self):
    p = self._Input(num_examples=256, data_seed=2)
    p.Set(name='test', shuffle=False, repeat=False)
    return p

  def Task(self):
    dims = [self.INPUT_DIM, self.HIDDEN_DIM, self.HIDDEN_DIM, self.NUM_CLASSES]
    fc = lambda name, i, act: core.FCLayer.Params().Set(
        name=name, input_dim=dims[i], output_dim=dims[i + 1], activation=act)
    model = core.SequentialLayer.Params().Set(name='mlp', layers=[
        fc('fc0', 0, 'RELU'),
        core.DropoutLayer.Params().Set(name='dropout', keep_prob=0.9),
        fc('fc1', 1, 'RELU'),
        fc('logits', 2, 'NONE'),
    ])
    p = tasks.ClassificationTask.Params()
    p.Set(model=model, random_seed=1, clip_gradient_norm_to_value=5.0)
    p.optimizer = optimizers.Adam.Params()
    p.learning_rate_schedule = lr_schedules.Constant.Params().Set(
        learning_rate=0.01)
    return p


@model_registry.RegisterSingleTaskModel
class TinyPipelined(Tiny):
  """Tiny's MLP as a GPipe pipeline: 2 cells, 4 micro-batches, recompute.

  The only change is the model Params: the same layer list wrapped in a
  PipeliningLayer. Its variables have the same paths, so it resumes from (and
  trains exactly like) Tiny except for dropout masks, which are drawn per
  micro-batch. On a CPU-only host the trainer splits the CPU into the 2
  devices it needs.
  """

  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4

  def Task(self):
    p = super().Task()
    p.model = pipeline.PipeliningLayer.Params().Set(
        name=p.model.name, layers=p.model.layers,
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, remat='always')
    return p
