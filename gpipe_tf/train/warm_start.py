"""Warm start: initialise a task's model variables from another run's checkpoint (transfer learning).

The fine-tuning recipe of the GPipe paper (Section 4.1, Table 4): take the
ImageNet run's weights, replace the softmax layer by one with the target
class count, train on the target set. Declared on the task Params::

  p.task.init_from_checkpoint = '/runs/imagenet'       # a logdir, its ckpt/,
                                                       # or a ckpt-N prefix
  p.task.init_from_checkpoint_skip = [r'^task/model/head/logits/']

The trainer (``train_lib``) calls ``InitFromCheckpoint`` only when its own
logdir holds no checkpoint: a fine-tuning run that resumes restores its own
newest checkpoint and never reads the source again.

What is loaded: every variable of the task (trainable ones and BatchNorm
moving statistics) whose name matches no skip pattern, paired with the
source variable of the same name (the checkpoint records the name each
variable had when saved). Names follow the layer tree, not the position in a
list of layers, so the source may have been a SequentialLayer or a
PipeliningLayer of any K and M, and the target may add layers the source
lacks (skipped, they keep their initial values). What is NOT loaded,
deliberately: the optimizer slots and the global step (fine-tuning starts at
step 0 with a fresh optimizer), and source variables the model lacks (the
old softmax layer, an auxiliary head: they are only counted).

A variable that is not skipped must exist in the source with the same
shape: otherwise WarmStartError / WarmStartShapeError name it (both shapes)
and say to add a skip pattern. A skip pattern that matches no variable is an
error too, so a typo cannot silently load the old softmax layer.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from typing import Any, Sequence

from absl import logging
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from gpipe_tf import errors
from gpipe_tf.train import checkpoints

__all__ = ['InitCheckpointNotFoundError', 'InitFromCheckpoint',
           'ResolveCheckpoint', 'WarmStartError', 'WarmStartResult',
           'WarmStartShapeError']

_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
_VALUE_ATTRIBUTE = 'VARIABLE_VALUE'
_ROOT = 'task'  # The name train_lib's tf.train.Checkpoint gives the task.


class WarmStartError(errors.Error, ValueError):
  """The source checkpoint cannot initialise the model as asked."""


class InitCheckpointNotFoundError(WarmStartError, FileNotFoundError):
  """init_from_checkpoint names no readable checkpoint."""


class WarmStartShapeError(WarmStartError):
  """A variable that is not skipped has another shape in the source."""


@dataclasses.dataclass
class WarmStartResult:
  """What InitFromCheckpoint did.

  Attributes:
    checkpoint: the checkpoint prefix read.
    loaded: names of the variables set from it.
    skipped: names of the variables that kept their initial values.
    unused: names of source variables nothing was loaded from.
  """
  checkpoint: str
  loaded: list[str]
  skipped: list[str]
  unused: list[str]


def ResolveCheckpoint(path: str) -> str:
  """The checkpoint prefix `path` stands for.

  Args:
    path: a checkpoint prefix ('.../ckpt-200'), a directory of checkpoints
      ('<logdir>/ckpt'), or a trainer logdir (its 'ckpt' subdirectory is
      used). In a directory the newest fully readable checkpoint is taken
      (gpipe_tf.train.checkpoints: the state file's first, then older ones).

  Raises:
    InitCheckpointNotFoundError: nothing readable there.
  """
  if tf.io.gfile.exists(path + '.index'):
    checkpoints.VerifyReadable(path)
    return path
  directory = path
  if tf.io.gfile.isdir(os.path.join(path, 'ckpt')):
    directory = os.path.join(path, 'ckpt')
  if tf.io.gfile.isdir(directory):
    for candidate in checkpoints.CandidateCheckpoints(directory):
      try:
        checkpoints.VerifyReadable(candidate)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Skipping unreadable checkpoint %s: %s', candidate,
                        type(e).__name__)
        continue
      return candidate
  raise InitCheckpointNotFoundError(
      f'init_from_checkpoint {path!r} is neither a checkpoint prefix (no '
      f'{path}.index) nor a directory holding a readable ckpt-N checkpoint '
      '(directly or in its ckpt/ subdirectory). Point it at the source run\'s '
      'logdir, its ckpt/ directory, or one ckpt-N prefix.')


def _VariableName(variable: Any) -> str:
  name = variable.name
  return name[:-2] if name.endswith(':0') else name


def _SourceVariables(proto: Any, node_id: int) -> dict[str, str]:
  """{variable name: checkpoint key} of every variable under node `node_id`.

  The names are the ones the variables had when saved (the object graph's
  full_name), e.g. 'task/model/head/logits/w'.
  """
  out, seen = {}, set()
  queue = collections.deque([node_id])
  while queue:
    nid = queue.popleft()
    if nid in seen:
      continue
    seen.add(nid)
    for attribute in proto.nodes[nid].attributes:
      if attribute.name == _VALUE_ATTRIBUTE and attribute.full_name:
        out[attribute.full_name] = attribute.checkpoint_key
    queue.extend(c.node_id for c in proto.nodes[nid].children)
  return out


def InitFromCheckpoint(task: tf.Module, path: str,
                       skip: Sequence[str] = ()) -> WarmStartResult:
  """Sets the variables of `task` from the task saved in checkpoint `path`.

  Args:
    task: the live task (its variables are assigned in place).
    path: see ResolveCheckpoint. The checkpoint must hold the task under the
      name 'task', as gpipe_tf.train.loop writes it.
    skip: regular expressions, each matched with re.search against variable
      names such as 'task/model/head/logits/w'; matching variables keep their
      initial values. Each pattern must match at least one variable.

  Returns:
    A WarmStartResult.

  Raises:
    InitCheckpointNotFoundError: no readable checkpoint at `path`.
    WarmStartShapeError: a variable not skipped has another shape in the
      source (the message names it and both shapes).
    WarmStartError: a variable not skipped is missing from the source; a skip
      pattern is malformed or matches nothing; the checkpoint holds no task.
  """
  prefix = ResolveCheckpoint(path)
  try:
    patterns = [re.compile(s) for s in skip]
  except re.error as e:
    raise WarmStartError(f'init_from_checkpoint_skip: bad regular expression '
                         f'{e.pattern!r}: {e}.') from e
  reader = tf.train.load_checkpoint(prefix)
  proto = trackable_object_graph_pb2.TrackableObjectGraph()
  proto.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  roots = {c.local_name: c.node_id for c in proto.nodes[0].children}
  if _ROOT not in roots:
    raise WarmStartError(
        f'Checkpoint {prefix} holds no {_ROOT!r} object (it has '
        f'{sorted(roots)}); init_from_checkpoint needs a checkpoint written '
        'by gpipe_tf.train.loop (or tf.train.Checkpoint(task=task)).')
  source = _SourceVariables(proto, roots[_ROOT])
  variables = list(task.variables)
  names = [_VariableName(v) for v in variables]
  for pattern in patterns:
    if not any(pattern.search(n) for n in names):
      raise WarmStartError(
          f'init_from_checkpoint_skip pattern {pattern.pattern!r} matches no '
          f'variable of the model; names look like {names[-1]!r}. Fix the '
          'pattern (it is matched with re.search).')
  shapes = reader.get_variable_to_shape_map()
  plan, skipped = [], []
  for variable, name in zip(variables, names):
    if any(p.search(name) for p in patterns):
      skipped.append(name)
      continue
    live = variable.shape.as_list()
    if name not in source:
      raise WarmStartError(
          f'Variable {name!r} (shape {live}) of the model is not in '
          f'{prefix}. Add a pattern matching it to init_from_checkpoint_skip '
          'to keep its initial value, or use a checkpoint of this model.')
    saved = list(shapes[source[name]])
    if saved != live:
      raise WarmStartShapeError(
          f'Variable {name!r} has shape {live} in the model but {saved} in '
          f'{prefix}. If it is meant to change (e.g. the softmax layer of a '
          'new class count), add a pattern matching it to '
          'init_from_checkpoint_skip.')
    plan.append((variable, name))
  # Everything checked: only now write, so a failure leaves the task as built.
  for variable, name in plan:
    variable.assign(tf.cast(reader.get_tensor(source[name]), variable.dtype))
  loaded = [name for _, name in plan]
  unused = sorted(set(source) - set(loaded))
  logging.info('Initialised %d variables from %s; %d kept their initial '
               'values (%s); %d source variables unused.', len(loaded),
               prefix, len(skipped), ', '.join(skipped) or 'none',
               len(unused))
  return WarmStartResult(prefix, loaded, skipped, unused)
