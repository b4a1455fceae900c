"""Crash-safe checkpoints: restore the newest good one, refuse another model's.

Saving (``tf.train.CheckpointManager``, verified in tests/checkpoints_test.py)
writes ``ckpt-N.index`` and ``ckpt-N.data-*`` through temporary names and only
then rewrites the ``checkpoint`` state file (atomically) to name ckpt-N. A
crash mid-save therefore leaves the state file naming the previous checkpoint,
next to incomplete files of ckpt-N::

  checkpoint        -> model_checkpoint_path: "ckpt-20"     (state file)
  ckpt-20.index / ckpt-20.data-00000-of-00001               (good)
  ckpt-30.index / ckpt-30.data-...  (partial or garbage: never recorded)

Restoring (``Checkpointer.Restore``) tries, in order:
  1. the checkpoint the state file names, then the older ckpt-* files (newer
     unrecorded files are the debris of an interrupted save and are ignored);
  2. when the state file is missing or unreadable (TensorFlow then reports no
     checkpoint at all, or raises), every ckpt-* file, newest first.
A candidate whose files cannot all be read (``VerifyReadable``) is skipped
with a warning. The first readable one is compared with the live objects
before anything is restored: a different variable shape, or under the strict
roots (``task`` and ``global_step``) a variable only one side has, raises
``IncompatibleCheckpointError``, and nothing is written or deleted.

The first ``Save`` after restoring past an unreadable state file moves that
file to ``checkpoint.corrupt`` and writes a good one. A save that fails (full
disk, lost permissions, an error inside TensorFlow's write) raises
``CheckpointWriteError`` naming the newest good checkpoint, which the state
file still names: nothing points at the failed one.

In a multi-worker job only the chief writes into ``directory``; every other
task is given a ``scratch_directory``: its saves (which TensorFlow may need
every task to take part in) go there and are deleted at once, and its
restores read the chief's ``directory``.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
from typing import Any, Iterable

from absl import logging
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from gpipe_tf import errors

__all__ = ['CHECKPOINT_NAME', 'CandidateCheckpoints', 'CheckCompatible',
           'CheckpointStep', 'CheckpointWriteError', 'Checkpointer',
           'IncompatibleCheckpointError', 'ListCheckpoints',
           'NoCheckpointError', 'STATE_FILE', 'VerifyReadable']

CHECKPOINT_NAME = 'ckpt'
STATE_FILE = 'checkpoint'
_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
_VALUE_ATTRIBUTE = 'VARIABLE_VALUE'


class IncompatibleCheckpointError(errors.Error, ValueError):
  """A checkpoint holds a different model (variable shapes or names differ)."""


class NoCheckpointError(errors.Error, FileNotFoundError):
  """A directory holds no readable checkpoint where one is required."""


class CheckpointWriteError(errors.Error, RuntimeError):
  """Writing a checkpoint failed; the previous one is still the newest good one."""


def CheckpointStep(path: str) -> int | None:
  """N of a checkpoint prefix '.../ckpt-N', else None."""
  match = re.fullmatch(rf'{CHECKPOINT_NAME}-(\d+)', os.path.basename(path))
  return int(match.group(1)) if match else None


def ListCheckpoints(directory: str) -> list[str]:
  """Prefixes of all ckpt-N files with an index in `directory`, newest first.

  Includes incomplete ones: listing says nothing about readability.
  """
  found = []
  for index in glob.glob(os.path.join(glob.escape(directory),
                                      f'{CHECKPOINT_NAME}-*.index')):
    prefix = index[:-len('.index')]
    step = CheckpointStep(prefix)
    if step is not None:
      found.append((step, prefix))
  return [prefix for _, prefix in sorted(found, reverse=True)]


def _ReadState(directory: str):
  """The parsed state file, or None when it is missing or unreadable."""
  if not tf.io.gfile.exists(os.path.join(directory, STATE_FILE)):
    return None
  try:
    # TensorFlow returns None for some corruptions and raises for others.
    state = tf.train.get_checkpoint_state(directory)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Cannot read %s: %s: %s', STATE_FILE, type(e).__name__, e)
    state = None
  if state is None:
    logging.warning('Checkpoint state file in %s is unreadable; falling back '
                    'to the newest readable checkpoint file.', directory)
  return state


def CandidateCheckpoints(directory: str) -> list[str]:
  """Checkpoints to try restoring, most trusted first (see the module doc)."""
  scanned = ListCheckpoints(directory)
  state = _ReadState(directory)
  if state is None or not state.model_checkpoint_path:
    return scanned
  latest = state.model_checkpoint_path
  if not os.path.isabs(latest):
    latest = os.path.join(directory, latest)
  latest_step = CheckpointStep(latest)
  older = [c for c in scanned if latest_step is None or
           CheckpointStep(c) < latest_step]
  return [latest] + [c for c in older if c != latest]


def VerifyReadable(path: str) -> None:
  """Reads every tensor of checkpoint `path` (checksums included).

  Costs one full read of the checkpoint; it guarantees that a restore started
  afterwards cannot fail half way, leaving variables from two checkpoints.

  Raises:
    Whatever TensorFlow raises for a missing, truncated or corrupt file:
    tf.errors.OpError (DataLossError, NotFoundError, ...), IndexError,
    google.protobuf.message.DecodeError, ...
  """
  reader = tf.train.load_checkpoint(path)
  proto = trackable_object_graph_pb2.TrackableObjectGraph()
  proto.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  for key in reader.get_variable_to_shape_map():
    reader.get_tensor(key)


def _Shape(shape: Any) -> list[int | None]:
  return tf.TensorShape(shape).as_list()


def _VariableName(obj: Any, path: tuple[str, ...]) -> str:
  name = getattr(obj, 'name', None) or getattr(obj, 'path', None)
  where = '/'.join(path)
  if isinstance(name, str):
    name = name[:-2] if name.endswith(':0') else name
    if name != where:
      return f"'{name}' (checkpoint path {where})"
  return f"'{where}'"


def _VariableNodes(proto, node_id: int, path: tuple[str, ...]
                   ) -> Iterable[tuple[tuple[str, ...], str]]:
  """(path, checkpoint key) of every variable at or under a checkpoint node."""
  seen, queue = set(), collections.deque([(node_id, path)])
  while queue:
    nid, p = queue.popleft()
    if nid in seen:
      continue
    seen.add(nid)
    for attr in proto.nodes[nid].attributes:
      if attr.name == _VALUE_ATTRIBUTE:
        yield p, attr.checkpoint_key
    for child in proto.nodes[nid].children:
      queue.append((child.node_id, p + (child.local_name,)))


def _LiveVariables(obj: Any, path: tuple[str, ...]
                   ) -> Iterable[tuple[tuple[str, ...], Any]]:
  """(path, variable) of every variable at or under a live trackable."""
  seen, queue = set(), collections.deque([(obj, path)])
  while queue:
    o, p = queue.popleft()
    if id(o) in seen:
      continue
    seen.add(id(o))
    if isinstance(o, tf.Variable) or (hasattr(o, 'shape') and
                                      hasattr(o, 'assign')):
      yield p, o
    for name, child in tf.train.TrackableView.children(o).items():
      queue.append((child, p + (name,)))


def CheckCompatible(path: str, root: tf.train.Checkpoint,
                    strict: Iterable[str] = ('task', 'global_step')) -> None:
  """Raises IncompatibleCheckpointError unless `path` fits the objects of root.

  Walks the checkpoint's object graph and the live objects together, the
  strict subtrees first, each breadth first. Every variable present on both
  sides must have the same shape; under the `strict` top-level names a
  variable present on one side only is an error too. Elsewhere (the
  optimizer) it is only logged.

  Raises:
    IncompatibleCheckpointError: naming the first mismatching variable and
      both shapes.
    tf.errors.OpError: the checkpoint cannot be read.
  """
  reader = tf.train.load_checkpoint(path)
  proto = trackable_object_graph_pb2.TrackableObjectGraph()
  proto.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  shapes = reader.get_variable_to_shape_map()
  strict = set(strict)
  where = f'checkpoint {path}'
  hint = ('. The directory holds another model: use a fresh logdir, or the '
          'Params that wrote it.')
  root_children = {c.local_name: c.node_id for c in proto.nodes[0].children}
  live_root = tf.train.TrackableView.children(root)
  # The strict subtrees (the model) first, so their mismatches are reported
  # before any in the optimizer, which mirrors the model's shapes.
  names = sorted(set(root_children) | set(live_root),
                 key=lambda n: (n not in strict, n))
  visited = {0}
  for name in names:
    is_strict = name in strict
    if name not in live_root:
      if is_strict:
        for var_path, key in _VariableNodes(proto, root_children[name],
                                            (name,)):
          raise IncompatibleCheckpointError(
              f"{where} has variable '{'/'.join(var_path)}' (shape "
              f'{_Shape(shapes[key])}) that the model lacks{hint}')
      continue
    queue = collections.deque()
    if name in root_children:
      queue.append((root_children[name], live_root[name], (name,)))
    else:
      _Missing(live_root[name], (name,), where, is_strict, hint)
    while queue:
      node_id, obj, p = queue.popleft()
      if node_id in visited:
        continue
      visited.add(node_id)
      keys = [a.checkpoint_key for a in proto.nodes[node_id].attributes
              if a.name == _VALUE_ATTRIBUTE]
      if keys and hasattr(obj, 'shape'):
        saved, live = _Shape(shapes[keys[0]]), _Shape(obj.shape)
        if saved != live:
          raise IncompatibleCheckpointError(
              f'Variable {_VariableName(obj, p)} has shape {live} in the model '
              f'but {saved} in {where}{hint}')
      ckpt_children = {c.local_name: c.node_id
                       for c in proto.nodes[node_id].children}
      live_children = tf.train.TrackableView.children(obj)
      for child_name, child in live_children.items():
        if child_name in ckpt_children:
          queue.append((ckpt_children[child_name], child, p + (child_name,)))
        else:
          _Missing(child, p + (child_name,), where, is_strict, hint)
      if not is_strict:
        continue
      for child_name, child_id in ckpt_children.items():
        if child_name in live_children:
          continue
        for var_path, key in _VariableNodes(proto, child_id,
                                            p + (child_name,)):
          raise IncompatibleCheckpointError(
              f"{where} has variable '{'/'.join(var_path)}' (shape "
              f'{_Shape(shapes[key])}) that the model lacks{hint}')


def _Missing(obj: Any, path: tuple[str, ...], where: str, is_strict: bool,
             hint: str) -> None:
  """Raises (strict) or warns about live variables absent from a checkpoint."""
  for var_path, var in _LiveVariables(obj, path):
    text = (f'Variable {_VariableName(var, var_path)} (shape '
            f'{_Shape(var.shape)}) of the model is not in {where}')
    if is_strict:
      raise IncompatibleCheckpointError(text + hint)
    logging.warning('%s; it keeps its initial value.', text)


class Checkpointer:
  """Saves `checkpoint` into `directory` and restores the newest good one.

  Args:
    directory: where ckpt-N files and the state file live.
    checkpoint: the tf.train.Checkpoint to save (e.g. task, optimizer,
      global_step). Build optimizer slots before calling Restore.
    max_to_keep: how many recent checkpoints the manager keeps.
    strict: top-level names of `checkpoint` whose variables must match the
      checkpoint one to one (see CheckCompatible).
    scratch_directory: set on a non-chief task of a multi-worker job: Save
      writes there, then deletes the directory; `directory` is only read.
    io_device: the device that reads and writes every checkpoint file, e.g.
      the trainer's CPU when variables live on other hosts (a pipeline
      cluster); default: each variable's own host (which must then see
      `directory` at the same path). The files are the same either way.
  """

  def __init__(self, directory: str, checkpoint: tf.train.Checkpoint,
               max_to_keep: int = 5,
               strict: Iterable[str] = ('task', 'global_step'),
               scratch_directory: str | None = None,
               io_device: str | None = None) -> None:
    self._directory = directory
    # Passed only when set: calls stay as they were for everyone else.
    self._options = ({'options': tf.train.CheckpointOptions(
        experimental_io_device=io_device)} if io_device else {})
    self._scratch_directory = scratch_directory
    self._checkpoint = checkpoint
    self._max_to_keep = max_to_keep
    self._strict = tuple(strict)
    self._manager: tf.train.CheckpointManager | None = None

  @property
  def directory(self) -> str:
    return self._directory

  def Restore(self) -> str | None:
    """Restores the newest readable checkpoint; returns its path (None: none).

    Raises:
      IncompatibleCheckpointError: that checkpoint holds another model. Nothing
        in `directory` is modified.
    """
    for path in CandidateCheckpoints(self._directory):
      try:
        VerifyReadable(path)
      except Exception as e:  # pylint: disable=broad-except
        # Partial files raise OpError, IndexError, DecodeError, ... alike.
        first_line = (str(e).splitlines() or [''])[0][:300]
        logging.warning('Skipping unreadable checkpoint %s: %s: %s', path,
                        type(e).__name__, first_line)
        continue
      CheckCompatible(path, self._checkpoint, self._strict)
      self._checkpoint.read(path, **self._options).expect_partial()
      logging.info('Restored checkpoint %s.', path)
      return path
    return None

  def Save(self, step: int) -> str:
    """Writes ckpt-`step` (data, then the state file); returns its path.

    With a scratch directory, writes there and deletes it; returns the path
    the chief's checkpoint of this step has.

    Raises:
      CheckpointWriteError: the write failed. The state file still names the
        previous checkpoint (or none), which a restart restores.
    """
    if self._scratch_directory is not None:
      try:
        self._checkpoint.write(os.path.join(self._scratch_directory,
                                            f'{CHECKPOINT_NAME}-{int(step)}'),
                               **self._options)
      finally:
        shutil.rmtree(self._scratch_directory, ignore_errors=True)
      return os.path.join(self._directory, f'{CHECKPOINT_NAME}-{int(step)}')
    try:
      return self._Save(step)
    except Exception as e:  # pylint: disable=broad-except
      self._manager = None  # Re-read the state file on the next attempt.
      state = _ReadState(self._directory)
      good = state.model_checkpoint_path if state else None
      first_line = (str(e).splitlines() or [''])[0][:300]
      raise CheckpointWriteError(
          f'Writing checkpoint {CHECKPOINT_NAME}-{int(step)} in '
          f'{self._directory} failed ({type(e).__name__}: {first_line}). '
          f'The newest good checkpoint is still {good or "none"}; a restart '
          'resumes from it. Check free space and write permission there.'
      ) from e

  def _Save(self, step: int) -> str:
    if self._manager is None:
      # Created lazily: constructing a manager reads the state file, and the
      # first save creates the directory. A state file the manager cannot
      # read is moved aside (to STATE_FILE.corrupt), and rewritten by the save.
      state_path = os.path.join(self._directory, STATE_FILE)
      if tf.io.gfile.exists(state_path) and _ReadState(
          self._directory) is None:
        tf.io.gfile.rename(state_path, state_path + '.corrupt', overwrite=True)
      self._manager = tf.train.CheckpointManager(
          self._checkpoint, self._directory, max_to_keep=self._max_to_keep,
          checkpoint_name=CHECKPOINT_NAME)
    return self._manager.save(checkpoint_number=int(step),
                              **self._options)
