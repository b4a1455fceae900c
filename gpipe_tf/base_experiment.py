"""Experiments: classes whose Train(), Test(), Task() give the Params of a run.

An experiment lives in ``params/<task>/<dataset>.py`` and is registered with
``@model_registry.RegisterSingleTaskModel``::

  @model_registry.RegisterSingleTaskModel
  class Tiny(base_experiment.SingleTaskModelParams):
    def Train(self): ...   # input generator Params of training
    def Test(self): ...    # input generator Params of evaluation
    def Task(self): ...    # task Params: model, loss, optimizer, schedule

Subclassing one and overriding a method is a new experiment (e.g. ``Wide(Tiny)``
overriding only ``Task``).

The three results are gathered into one *experiment Params* with fields
``train``, ``test`` and ``task``: what the trainer runs, what it writes to
``logdir/params.txt``, and what ``--model_params_override`` edits
(``ApplyOverrides``).
"""

from __future__ import annotations

from typing import Union

from gpipe_tf import hyperparams

__all__ = ['ApplyOverrides', 'AsExperimentParams', 'EXPERIMENT_FIELDS',
           'ExperimentLike', 'SingleTaskModelParams']

EXPERIMENT_FIELDS = ('train', 'test', 'task')


class SingleTaskModelParams:
  """Base class of experiments with one task. Override all three methods.

  Methods are called on a fresh instance each time the registry builds
  Params, so they must return new Params objects and keep no state.
  """

  def Train(self) -> hyperparams.Params:
    """Input generator Params of training (the trainer repeats it)."""
    raise NotImplementedError(f'{type(self).__name__} must define Train().')

  def Test(self) -> hyperparams.Params:
    """Input generator Params of evaluation (read once per evaluation)."""
    raise NotImplementedError(f'{type(self).__name__} must define Test().')

  def Task(self) -> hyperparams.Params:
    """Task Params (gpipe_tf.tasks): model, loss, optimizer and schedule."""
    raise NotImplementedError(f'{type(self).__name__} must define Task().')

  def ExperimentParams(self) -> hyperparams.Params:
    """Train(), Test() and Task() gathered into one Params."""
    p = hyperparams.Params()
    p.Define('train', self.Train(), 'Input generator Params of training.')
    p.Define('test', self.Test(), 'Input generator Params of evaluation.')
    p.Define('task', self.Task(), 'Task Params: model, loss, optimizer.')
    return p


ExperimentLike = Union[SingleTaskModelParams, type, hyperparams.Params]


def AsExperimentParams(experiment: ExperimentLike) -> hyperparams.Params:
  """Experiment Params from an experiment class, instance, or Params.

  Params are copied and must define ``train``, ``test`` and ``task``.

  Raises:
    TypeError: `experiment` is none of these.
  """
  if isinstance(experiment, type) and issubclass(experiment,
                                                 SingleTaskModelParams):
    experiment = experiment()
  if isinstance(experiment, SingleTaskModelParams):
    return experiment.ExperimentParams()
  if isinstance(experiment, hyperparams.Params):
    missing = [f for f in EXPERIMENT_FIELDS if f not in experiment]
    if missing:
      raise TypeError(f'Experiment Params lack fields {missing}; build them '
                      'with SingleTaskModelParams.ExperimentParams().')
    return experiment.Copy()
  raise TypeError('Expected a SingleTaskModelParams class or instance, or '
                  f'experiment Params; got {type(experiment).__name__}.')


def ApplyOverrides(params: hyperparams.Params, text: str) -> hyperparams.Params:
  """Applies ``--model_params_override`` text to experiment Params, in place.

  The text has ``ToText`` format (``path : value`` statements separated by
  newlines or ';'). A path starting with ``train.``, ``test.`` or ``task.``
  is taken as is, exactly as printed in ``logdir/params.txt``; any other path
  is relative to the task Params (Lingvo's convention), so
  ``learning_rate_schedule.learning_rate : 0.01`` equals
  ``task.learning_rate_schedule.learning_rate : 0.01``.

  Returns:
    `params`.

  Raises:
    hyperparams.ParamsParseError: a malformed statement (named in the error).
    hyperparams.UnknownParamError: an unknown path, with the closest defined
      ones (an AttributeError).
  """
  statements = []
  for statement in _SplitStatements(text):
    key, sep, _ = statement.partition(':')
    head = key.strip().split('.', 1)[0].split('[', 1)[0]
    if sep and key.strip() and head not in EXPERIMENT_FIELDS:
      statement = 'task.' + statement.lstrip()
    statements.append(statement)
  return params.FromText('\n'.join(statements))


def _SplitStatements(text: str) -> list[str]:
  """Splits at newlines and ';' outside quotes; drops blanks and comments."""
  statements, buf, quote, i = [], [], '', 0
  while i < len(text):
    c = text[i]
    if quote:
      buf.append(c)
      if c == '\\' and i + 1 < len(text):
        buf.append(text[i + 1])
        i += 1
      elif c == quote:
        quote = ''
    elif c in '\'"':
      quote = c
      buf.append(c)
    elif c == '#':
      while i < len(text) and text[i] != '\n':
        i += 1
      continue
    elif c in ';\n':
      statements.append(''.join(buf))
      buf = []
    else:
      buf.append(c)
    i += 1
  statements.append(''.join(buf))
  return [s.strip() for s in statements if s.strip()]
