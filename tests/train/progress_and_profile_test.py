"""Tests of the trainer's progress lines (ETA) and --profile_steps (gpipe_tf.train.runner, gpipe_tf.train.profiler, trainer)."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import glob  # pylint: disable=g-import-not-at-top,g-bad-import-order
import itertools
import os
import re
from unittest import mock

from absl import flags
from absl.testing import flagsaver

from gpipe_tf import trainer
from gpipe_tf.train import loop
from gpipe_tf.train import runner as runner_lib
from params.synthetic import mlp

FLAGS = flags.FLAGS
# 'Step 4/6: accuracy=..., loss=... (ETA 1s)'
PROGRESS = re.compile(
    r'^Step (\d+)/(\d+): (.*) \(ETA ((?:\d+h)?(?:\d+m)?(?:\d+s)?)\)$')


def _Profiles(logdir):
  return glob.glob(os.path.join(logdir, 'train', 'plugins', 'profile', '*',
                                '*.xplane.pb'))


def _ProgressLines(logs):
  return [m for m in (PROGRESS.match(r.getMessage()) for r in logs.records)
          if m]


class ProgressAndProfileTest(test_utils.FlagsParsedTestCase):

  def testTrainerFlagWritesTheProfileAndLinesGiveTheEta(self):
    logdir = os.path.join(self.root, 'profiled')
    with flagsaver.flagsaver(model='synthetic.mlp.Tiny', logdir=logdir,
                             mode='train', max_steps=6, log_interval_steps=2,
                             profile_steps='3,4'):
      with self.assertLogs('absl', 'INFO') as logs:
        trainer.main(['trainer'])
    profiles = _Profiles(logdir)
    self.assertLen(profiles, 1)
    self.assertGreater(os.path.getsize(profiles[0]), 1000)
    self.assertTrue(any('Profiling steps 3 to 4' in r.getMessage()
                        for r in logs.records))
    lines = _ProgressLines(logs)
    self.assertEqual([(int(m[1]), int(m[2])) for m in lines],
                     [(2, 6), (4, 6), (6, 6)])
    self.assertEqual(lines[-1][4], '0s')  # At the last step.
    self.assertIn('loss=', lines[0][3])

  def testEtaIsTheStepTimeTimesTheStepsLeft(self):
    # A clock that advances 100 s per reading: the loop reads it when an
    # interval starts and when it ends, so each 5-step interval takes 100 s,
    # 20 s a step, and the ETA at step N is 20 s x (20 - N).
    clock = mock.Mock()
    clock.time.side_effect = (100.0 * i for i in itertools.count())
    logdir = os.path.join(self.root, 'eta')
    with mock.patch.object(runner_lib, 'time', clock):
      with self.assertLogs('absl', 'INFO') as logs:
        loop.train_and_evaluate(mlp.Tiny, logdir, 'train', 20,
                                log_interval_steps=5)
    self.assertEqual([(int(m[1]), m[4]) for m in _ProgressLines(logs)],
                     [(5, '5m00s'), (10, '3m20s'), (15, '1m40s'), (20, '0s')])

  def testNoProfileWithoutTheFlagAndBadValuesRefused(self):
    logdir = os.path.join(self.root, 'plain')
    loop.train_and_evaluate(mlp.Tiny, logdir, 'train', 2)
    self.assertEmpty(_Profiles(logdir))
    for steps in ((0, 2), (3, 2), (2,)):
      with self.subTest(steps=steps):
        with self.assertRaisesRegex(loop.TrainConfigError, 'profile_steps'):
          loop.train_and_evaluate(mlp.Tiny, logdir, 'train', 2,
                                  profile_steps=steps)
    for value in ('3', '4,2', 'a,b'):
      with self.subTest(flag=value):
        with flagsaver.flagsaver(model='synthetic.mlp.Tiny', logdir=logdir,
                                 profile_steps=value):
          with self.assertRaises(SystemExit) as cm:
            trainer.main(['trainer'])
        self.assertIn('FlagError: --profile_steps=', str(cm.exception.code))
