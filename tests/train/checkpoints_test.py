"""Tests of gpipe_tf.train.checkpoints: crashes, corrupt state, other models."""

import hashlib
import os
import shutil
import tempfile
from unittest import mock


import tensorflow as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
from tensorflow.python.checkpoint import functional_saver  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

from gpipe_tf.train import checkpoints  # pylint: disable=g-import-not-at-top
from gpipe_tf import tasks  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top


class _Objects:
  """A small task, its Adam optimizer, a global step and their Checkpointer."""

  def __init__(self, directory, hidden=8, num_layers=2, scratch=None):
    dims = [4] + [hidden] * (num_layers - 1) + [3]
    layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=dims[i],
                                        output_dim=dims[i + 1])
              for i in range(num_layers)]
    self.task = tasks.ClassificationTask.Params().Set(
        model=core.SequentialLayer.Params().Set(layers=layers)).Instantiate()
    self.optimizer = self.task.CreateOptimizer()
    self.optimizer.build(self.task.trainable_variables)
    self.global_step = tf.Variable(0, dtype=tf.int64)
    self.checkpoint = tf.train.Checkpoint(
        task=self.task, optimizer=self.optimizer, global_step=self.global_step)
    self.checkpointer = checkpoints.Checkpointer(
        directory, self.checkpoint, scratch_directory=scratch)

  def Advance(self, step):
    """Moves every variable to a value that identifies `step`."""
    for i, v in enumerate(self.task.trainable_variables):
      v.assign(tf.fill(v.shape, float(step * 100 + i)))
    self.optimizer.iterations.assign(step)
    self.global_step.assign(step)

  def SaveAt(self, step):
    self.Advance(step)
    return self.checkpointer.Save(step)

  def AssertAt(self, test, step):
    test.assertEqual(int(self.global_step.numpy()), step)
    test.assertEqual(int(self.optimizer.iterations.numpy()), step)
    for i, v in enumerate(self.task.trainable_variables):
      test.assertAllEqual(v.numpy(), tf.fill(v.shape, float(step * 100 + i)))


def _Snapshot(directory):
  """{relative path: (size, mtime, sha1)} of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest = hashlib.sha1(f.read()).hexdigest()
      st = os.stat(path)
      out[os.path.relpath(path, directory)] = (st.st_size, st.st_mtime_ns,
                                               digest)
  return out


class CheckpointerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'ckpt')

  def _Restored(self, **kwargs):
    objects = _Objects(self.dir, **kwargs)
    return objects, objects.checkpointer.Restore()

  def testRoundTripRestoresTheNewest(self):
    writer = _Objects(self.dir)
    writer.SaveAt(10)
    writer.SaveAt(20)
    objects, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 20)
    objects.AssertAt(self, 20)

  def testNothingToRestore(self):
    objects, path = self._Restored()
    self.assertIsNone(path)
    self.assertFalse(os.path.exists(self.dir))  # Restore creates nothing.
    self.assertEqual(int(objects.global_step.numpy()), 0)

  def testCrashAfterFilesBeforeStateKeepsThePreviousCheckpoint(self):
    writer = _Objects(self.dir)
    writer.SaveAt(20)
    writer.Advance(30)
    with mock.patch.object(checkpoint_management,
                           'update_checkpoint_state_internal',
                           side_effect=RuntimeError('simulated crash')):
      with self.assertRaisesRegex(checkpoints.CheckpointWriteError,
                                  'RuntimeError: simulated crash'):
        writer.checkpointer.Save(30)
    # The manager wrote ckpt-30's files before it would update the state.
    self.assertTrue(os.path.exists(os.path.join(self.dir, 'ckpt-30.index')))
    self.assertEndsWith(tf.train.latest_checkpoint(self.dir), 'ckpt-20')
    objects, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 20)
    objects.AssertAt(self, 20)

  def testFailedWriteKeepsThePreviousCheckpointAndSaysSo(self):
    writer = _Objects(self.dir)
    writer.SaveAt(10)
    writer.SaveAt(20)
    before = _Snapshot(self.dir)
    writer.Advance(30)
    full = tf.errors.ResourceExhaustedError(None, None,
                                            'No space left on device')
    # Fails inside TensorFlow's write: after the data shards, before the
    # index that makes ckpt-30 a checkpoint.
    with mock.patch.object(functional_saver.gen_io_ops,
                           'merge_v2_checkpoints', side_effect=full) as merge:
      with self.assertRaisesRegex(
          checkpoints.CheckpointWriteError,
          r'Writing checkpoint ckpt-30 in .* failed \(ResourceExhaustedError: '
          r'No space left on device\)\. The newest good checkpoint is still '
          r'\S*ckpt-20; a restart resumes from it'):
        writer.checkpointer.Save(30)
    self.assertTrue(merge.called)
    self.assertFalse(os.path.exists(os.path.join(self.dir, 'ckpt-30.index')))
    after = _Snapshot(self.dir)
    for name, value in before.items():  # Old files untouched (debris aside).
      self.assertEqual(after[name], value, name)
    objects, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 20)
    objects.AssertAt(self, 20)
    # Once the disk is fine again the same Checkpointer saves normally.
    writer.SaveAt(40)
    again, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 40)
    again.AssertAt(self, 40)

  def testScratchDirectoryIsWrittenThenDeleted(self):
    _Objects(self.dir).SaveAt(10)  # The chief's.
    before = _Snapshot(self.dir)
    scratch = os.path.join(os.path.dirname(self.dir), 'scratch_worker_1')
    other = _Objects(self.dir, scratch=scratch)
    path = other.checkpointer.Restore()  # Reads the chief's directory.
    self.assertEqual(checkpoints.CheckpointStep(path), 10)
    other.AssertAt(self, 10)
    written = []
    write = other.checkpoint.write

    def _Write(prefix):
      written.append(prefix)
      result = write(prefix)
      self.assertTrue(os.path.exists(prefix + '.index'))
      return result

    with mock.patch.object(other.checkpoint, 'write', _Write):
      path = other.SaveAt(20)
    self.assertEqual(path, os.path.join(self.dir, 'ckpt-20'))
    self.assertEqual(written, [os.path.join(scratch, 'ckpt-20')])
    self.assertFalse(os.path.exists(scratch))
    self.assertEqual(_Snapshot(self.dir), before)  # The chief's untouched.

  def _WriteGarbage(self, step):
    for suffix in ('.index', '.data-00000-of-00001'):
      with open(os.path.join(self.dir, f'ckpt-{step}{suffix}'), 'wb') as f:
        f.write(b'\x00garbage of an interrupted save' * 7)

  def _WriteTruncatedCopy(self, source_step, step):
    for suffix in ('.index', '.data-00000-of-00001'):
      shutil.copy(os.path.join(self.dir, f'ckpt-{source_step}{suffix}'),
                  os.path.join(self.dir, f'ckpt-{step}{suffix}'))
    data = os.path.join(self.dir, f'ckpt-{step}.data-00000-of-00001')
    with open(data, 'r+b') as f:
      f.truncate(os.path.getsize(data) // 2)

  def testPartialNewerFilesAreIgnored(self):
    writer = _Objects(self.dir)
    writer.SaveAt(10)
    writer.SaveAt(20)
    self._WriteGarbage(30)
    self._WriteTruncatedCopy(20, 25)
    objects, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 20)
    objects.AssertAt(self, 20)

  def testCorruptStateFileFallsBackToNewestReadable(self):
    writer = _Objects(self.dir)
    writer.SaveAt(10)
    writer.SaveAt(20)
    self._WriteGarbage(30)
    self._WriteTruncatedCopy(20, 25)
    for state in (b'model_checkpoint_path: "ckpt-2', b'\xff\x00{{', b''):
      with self.subTest(state=state):
        with open(os.path.join(self.dir, 'checkpoint'), 'wb') as f:
          f.write(state)
        objects, path = self._Restored()
        self.assertEqual(checkpoints.CheckpointStep(path), 20)
        objects.AssertAt(self, 20)
    # Training goes on: the next save sets the corrupt file aside and writes
    # a good one.
    objects.SaveAt(30)
    self.assertTrue(os.path.exists(os.path.join(self.dir,
                                                'checkpoint.corrupt')))
    again, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 30)
    again.AssertAt(self, 30)

  def testStateNamingMissingFilesFallsBackToOlder(self):
    writer = _Objects(self.dir)
    writer.SaveAt(10)
    writer.SaveAt(20)
    for suffix in ('.index', '.data-00000-of-00001'):
      os.remove(os.path.join(self.dir, f'ckpt-20{suffix}'))
    objects, path = self._Restored()
    self.assertEqual(checkpoints.CheckpointStep(path), 10)
    objects.AssertAt(self, 10)


class IncompatibleCheckpointTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'ckpt')
    _Objects(self.dir, hidden=8).SaveAt(10)
    self.before = _Snapshot(self.dir)

  def _AssertRefused(self, pattern, **kwargs):
    objects = _Objects(self.dir, **kwargs)
    initial = [v.numpy() for v in objects.task.variables]
    with self.assertRaisesRegex(checkpoints.IncompatibleCheckpointError,
                                pattern):
      objects.checkpointer.Restore()
    self.assertEqual(_Snapshot(self.dir), self.before)  # Nothing written.
    for v, value in zip(objects.task.variables, initial):
      self.assertAllEqual(v.numpy(), value)             # Nothing restored.
    self.assertEqual(int(objects.global_step.numpy()), 0)

  def testOtherHiddenSizeNamesVariableAndBothShapes(self):
    self._AssertRefused(
        r"'task/model/fc0/\w+'.*shape \[.*16\] in the model but \[.*8\] in "
        r'checkpoint .*ckpt-10', hidden=16)

  def testExtraModelLayerRefused(self):
    self._AssertRefused(r"'task/model/fc2/\w+'.*\(shape \[.*\]\) of the model "
                        'is not in checkpoint', num_layers=3)

  def testExtraCheckpointLayerRefused(self):
    shutil.rmtree(self.dir)
    _Objects(self.dir, num_layers=3).SaveAt(10)
    self.before = _Snapshot(self.dir)
    self._AssertRefused(r"has variable 'task/model/layers/2/\w+' \(shape "
                        r'\[.*\]\) that the model lacks', num_layers=2)


if __name__ == '__main__':
  tf.test.main()
