"""schedule='auto' (auto_schedule.py): the chosen layout trains as SequentialLayer does, within its memory budget."""

import test_utils  # pylint: disable=g-bad-import-order

from unittest import mock

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import layers as layers_lib
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import auto_schedule
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import layer_bytes
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import partition
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import layout
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import simulate


def _LossFn(logits, labels):
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(logits, labels),
                            1.0 + tf.cast(labels, tf.float32), {})


def _Auto(k=2, m=4, remat='never', **kw):
  return PipeliningLayer.Params().Set(
      name='net', layers=test_utils.MlpLayers(), num_partitions=k,
      num_micro_batches=m, schedule='auto', remat=remat,
      **kw).Instantiate()


def _Peaks(choice):
  """The chosen schedule's peaks, straight from the simulator and model."""
  problem, sched = choice.problem, choice.schedule
  kept = memory.KeptForwards(sched, problem.remat)
  sim = simulate.Simulate(sched, problem.forward, problem.backward,
                          problem.weight)
  return memory.Profile(sched, problem.stage_bytes, kept, sim).peak


def _Wide(n=8, width=8, hidden=256):
  """n feed-forward blocks: each keeps its hidden layer, 32x its output."""
  return [layers_lib.TransformerFeedForwardLayer.Params().Set(
      name=f'ffn{i}', input_dim=width, hidden_dim=hidden) for i in range(n)]


def _SquareLoss(outputs, labels):
  del labels
  return loss_lib.LossTerms(tf.reduce_sum(tf.square(outputs), [1, 2]), None,
                            {})


def _TracedPeaks(pipe, sim):
  """What `pipe`'s traced cells hold per device, weights included, in the
  memory model of its schedule timed by `sim`, after one training step."""
  x = tf.random.stateless_normal([32, 4, 8], seed=[3, 4])
  pipe.ComputeLossAndGradients(x, tf.zeros([32]), _SquareLoss)
  stages = introspect.TracedStageBytes(pipe.cells)
  kept = memory.KeptForwards(pipe.schedule, pipe.p.remat)
  return memory.Profile(pipe.schedule, stages, kept, sim).peak


class AutoScheduleTest(tf.test.TestCase):

  def testTrainsLikeSequential(self):
    x = tf.random.stateless_normal([11, 6], seed=[1, 2])
    y = tf.random.stateless_uniform([11], [5, 6], 0, 5, tf.int32)
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=test_utils.MlpLayers()).Instantiate()
    with tf.GradientTape() as tape:
      want_loss, _ = loss_lib.ReduceTerms(_LossFn(seq.FProp(x), y))
    want = tape.gradient(want_loss, seq.trainable_variables)
    for k, m, remat in ((2, 4, 'never'), (4, 8, 'never'), (2, 4, 'always')):
      pipe = _Auto(k, m, remat)  # The same variable paths: the same weights.
      loss, _, grads = pipe.ComputeLossAndGradients(x, y, _LossFn)
      with self.subTest(k=k, m=m, remat=remat):
        self.assertEqual(pipe.schedule.num_devices, k)
        self.assertEqual(len(pipe.cells), len(pipe.schedule_choice.balance))
        self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
        self.assertLen(grads, len(want))
        for a, b in zip(want, grads):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testDefaultBudgetIsOneFOneBsPeak(self):
    pipe = _Auto(4, 8)
    choice = pipe.schedule_choice
    layers = auto_schedule.LayerCosts(
        test_utils.MlpLayers(), 'flops', ((None, 6),), None, 8)
    budget = layout.OneFOneBPeak(layers, 4, 8)
    self.assertLessEqual(max(_Peaks(choice)), budget * (1 + 1e-9))
    self.assertEqual(choice.synthesized.budget, (budget,) * 4)
    one_f = layout.StageProblem(
        layers, partition.PartitionBalanced(
            [3 * c.forward for c in layers], 4), 4, 8)
    self.assertLessEqual(choice.makespan, simulate.Simulate(
        schedule_lib.Make('1f1b', 4, 8), one_f.forward, one_f.backward,
        one_f.weight).makespan)

  def testBudgetIsHonoured(self):
    loose = _Auto(4, 8).schedule_choice
    budget = 0.75 * max(loose.peaks)
    pipe = _Auto(4, 8, memory_budget=budget)
    self.assertLessEqual(max(_Peaks(pipe.schedule_choice)), budget)
    with self.assertRaisesRegex(schedule_lib.MemoryBudgetError,
                                'raise the budget to at least'):
      _Auto(4, 8, memory_budget=0.1 * budget)

  def testTracedSizesKeepTheChoiceWithinItsBudget(self):
    # The blocks keep 32x their output for their backward. 'auto' must
    # choose in a model of what the step holds: in the memory model over
    # the sizes its traced cells keep, the choice fits the budget, here
    # 1F1B's peak in that model. (Sized by the blocks' outputs, the
    # activations look nearly free beside the weights and the choice holds
    # every micro-batch.)
    make = lambda **kw: PipeliningLayer.Params().Set(
        name='net', layers=_Wide(), num_partitions=2, num_micro_batches=8,
        remat='never', input_shapes=[(32, 4, 8)], **kw).Instantiate()
    one_f = make(schedule='1f1b')
    budget = max(_TracedPeaks(one_f, simulate.Simulate(one_f.schedule)))
    pipe = make(schedule='auto', memory_budget=budget)
    choice = pipe.schedule_choice
    traced = _TracedPeaks(pipe, simulate.Simulate(
        pipe.schedule, choice.problem.forward, choice.problem.backward,
        choice.problem.weight))
    # The layers' traced sizes summed per stage, against the stage's own:
    # their activations equal (the next test); the first stage's W stash
    # traces smaller than its layers' sum, so the model is over, not under.
    self.assertLessEqual(max(traced), budget, (traced, budget))
    for chosen, held in zip(choice.peaks, traced):
      self.assertAllClose(chosen, held, rtol=0.1)

  def testAStageKeepsWhatItsCellTraces(self):
    # The activations a stage's kept forward holds, summed from its
    # layers (their own and joined to the layer before: a feed-forward
    # block's input is its residual, which the block before does not keep)
    # against its cell's trace: equal but in the last stage, whose cell
    # also keeps the loss's (4 bytes a position and example more).
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Wide(), num_partitions=2, num_micro_batches=8,
        remat='never', input_shapes=[(32, 4, 8)],
        schedule='auto').Instantiate()
    x = tf.random.stateless_normal([32, 4, 8], seed=[3, 4])
    pipe.ComputeLossAndGradients(x, tf.zeros([32]), _SquareLoss)
    model = [b.activations
             for b in pipe.schedule_choice.problem.stage_bytes]
    traced = [b.activations for b in introspect.TracedStageBytes(pipe.cells)]
    self.assertEqual(model[:-1], traced[:-1])
    self.assertAllClose(model[-1], traced[-1], rtol=0.02)

  def testEachDistinctLayerAndPairIsTracedOnce(self):
    with mock.patch.object(layer_bytes, '_Trace',
                           wraps=layer_bytes._Trace) as trace:
      layers = auto_schedule.LayerCosts(_Wide(4), 'flops', ((8, 4, 8),),
                                        None, 2)
    self.assertEqual(trace.call_count, 2)  # One block alone, one pair.
    self.assertEqual(layers[0].joined, memory.StageBytes())
    self.assertGreater(layers[1].joined.activations, 0)

  def testOutputsSizesAreTheOtherChoice(self):
    layers = _Wide(2)
    outputs = auto_schedule.LayerCosts(layers, 'flops', ((8, 4, 8),), None,
                                       2, activations='outputs')
    traced = auto_schedule.LayerCosts(layers, 'flops', ((8, 4, 8),), None,
                                      2, activations='traced')
    # 4 examples a micro-batch, 4 positions: 8 floats an output, 256 the
    # hidden layer the block keeps.
    self.assertEqual(outputs[0].bytes.activations, 4 * 4 * 8 * 4)
    self.assertGreater(traced[0].bytes.activations, 4 * 4 * 256 * 4)
    with self.assertRaisesRegex(auto_schedule.ActivationsError, "'traced'"):
      auto_schedule.LayerCosts(layers, 'flops', ((8, 4, 8),), None, 2,
                               activations='guessed')

  def testLogsWhatItChose(self):
    # The absl call itself: another test may have set absl's verbosity above
    # INFO, and then no record reaches a handler.
    with mock.patch.object(auto_schedule.logging, 'info') as info:
      _Auto(2, 4)
    lines = [call.args[0] % call.args[1:] for call in info.call_args_list]
    self.assertTrue(any("schedule='auto'" in line and 'predicted step' in line
                        for line in lines), lines)

  def testBalanceIsChosenNotGiven(self):
    with self.assertRaisesRegex(partition.PartitionError, 'drop balance'):
      _Auto(2, 4, balance=[4, 4])


if __name__ == '__main__':
  tf.test.main()
