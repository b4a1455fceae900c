"""The registry of experiments: names like 'synthetic.mlp.Tiny' to classes.

``@RegisterSingleTaskModel`` on class ``C`` in module
``params.<task>.<dataset>`` registers it as ``<task>.<dataset>.C``: the name is
the module path without the leading ``params.`` package, plus the class name
(a class outside ``params`` keeps its full module path). Lookups import
``params.<task>.<dataset>`` on demand, so adding an experiment needs no
central list of imports.

An unknown name raises ``ModelNotFoundError`` listing the closest registered
names; to know them every module under ``params/`` is imported (the
``params`` package must be importable: run from the repository root or
install it).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import TypeVar

from absl import logging

from gpipe_tf import errors
from gpipe_tf import base_experiment
from gpipe_tf import hyperparams

__all__ = ['DuplicateModelError', 'GetClass', 'GetParams', 'ListModels',
           'ModelName', 'ModelNotFoundError', 'PARAMS_PACKAGE',
           'RegisterSingleTaskModel', 'UnknownDatasetError']

PARAMS_PACKAGE = 'params'

_T = TypeVar('_T', bound=type)
_REGISTRY: dict[str, type] = {}


class ModelNotFoundError(errors.Error, LookupError):
  """No experiment is registered under the name asked for."""


class DuplicateModelError(errors.Error, ValueError):
  """Two different classes were registered under one name."""


class UnknownDatasetError(errors.Error, ValueError):
  """GetParams was asked for a dataset other than 'Train', 'Test' or 'Task'."""


def ModelName(cls: type) -> str:
  """The registry name of experiment class `cls`."""
  module = cls.__module__
  prefix = PARAMS_PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  return f'{module}.{cls.__name__}'


def RegisterSingleTaskModel(cls: _T) -> _T:
  """Class decorator: registers experiment `cls` under ModelName(cls).

  Raises:
    TypeError: `cls` is not a SingleTaskModelParams subclass.
    DuplicateModelError: another class already has that name.
  """
  if not (isinstance(cls, type) and
          issubclass(cls, base_experiment.SingleTaskModelParams)):
    raise TypeError(f'{cls!r} is not a subclass of '
                    'base_experiment.SingleTaskModelParams.')
  name = ModelName(cls)
  existing = _REGISTRY.get(name)
  if existing is not None and existing is not cls:
    raise DuplicateModelError(
        f"Model '{name}' is already registered to {existing!r} "
        f'({existing.__module__}); rename {cls.__qualname__}.')
  _REGISTRY[name] = cls
  return cls


def _ImportModuleOf(name: str) -> None:
  """Imports params.<task>.<dataset> for name '<task>.<dataset>.<Class>'."""
  module, _, _ = name.rpartition('.')
  if not module:
    return
  full = f'{PARAMS_PACKAGE}.{module}'
  try:
    importlib.import_module(full)
  except ModuleNotFoundError as e:
    # Only a missing module on the path itself means "no such experiment";
    # a module that exists but fails to import is a bug worth surfacing.
    if not e.name or not (full + '.').startswith(e.name + '.'):
      raise


def _ImportAll() -> None:
  """Imports every module under the params package (skipping broken ones)."""
  try:
    package = importlib.import_module(PARAMS_PACKAGE)
  except ModuleNotFoundError:
    logging.warning("Package '%s' is not importable; only experiments already "
                    'imported are known.', PARAMS_PACKAGE)
    return
  for info in pkgutil.walk_packages(package.__path__, PARAMS_PACKAGE + '.'):
    try:
      importlib.import_module(info.name)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Cannot import %s: %s: %s', info.name,
                      type(e).__name__, e)


def ListModels() -> list[str]:
  """All registered names, sorted (imports every module under params/)."""
  _ImportAll()
  return sorted(_REGISTRY)


def GetClass(name: str) -> type:
  """The experiment class registered as `name`.

  Raises:
    ModelNotFoundError: nothing is registered as `name`; the message lists the
      closest registered names.
  """
  if name not in _REGISTRY:
    _ImportModuleOf(name)
  if name in _REGISTRY:
    return _REGISTRY[name]
  known = ListModels()
  close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
  if not close:
    lowered = {k.lower(): k for k in known}
    close = [lowered[k] for k in difflib.get_close_matches(
        name.lower(), list(lowered), n=5, cutoff=0.3)]
  if close:
    hint = 'Closest registered names: ' + ', '.join(close) + '.'
  elif known:
    hint = 'Registered names: ' + ', '.join(known[:20]) + (
        ', ...' if len(known) > 20 else '') + '.'
  else:
    hint = 'No model is registered.'
  raise ModelNotFoundError(
      f"No model registered as '{name}'. {hint} Experiments are classes in "
      f'{PARAMS_PACKAGE}/<task>/<dataset>.py decorated with '
      '@model_registry.RegisterSingleTaskModel, named '
      '<task>.<dataset>.<Class>.')


def GetParams(name: str, dataset: str | None = None) -> hyperparams.Params:
  """Params of the experiment registered as `name`.

  Args:
    name: registered name, e.g. 'synthetic.mlp.Tiny'.
    dataset: None for the experiment Params (fields train, test, task);
      otherwise the name of one of the experiment's methods ('Train', 'Test',
      'Task') whose Params to return.

  Raises:
    ModelNotFoundError: unknown `name`.
    UnknownDatasetError: the experiment has no method `dataset`.
  """
  experiment = GetClass(name)()
  if dataset is None:
    return experiment.ExperimentParams()
  method = getattr(experiment, dataset, None)
  if not dataset[:1].isupper() or not callable(method):
    raise UnknownDatasetError(f"Experiment '{name}' has no method "
                              f"{dataset!r}; use 'Train', 'Test' or 'Task'.")
  return method()
