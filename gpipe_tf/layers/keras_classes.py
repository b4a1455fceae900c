"""Keras layer classes named in Params: a class from its text (ResolveKerasClass) and the text of a class (KerasClassPath)."""

from __future__ import annotations

import importlib

import keras

from gpipe_tf.layers.keras_errors import UnknownKerasClassError

__all__ = ['KerasClassPath', 'ResolveKerasClass']


def ResolveKerasClass(name: str) -> type:
  """The Keras layer class `name` names (see KerasLayer Params keras_class).

  Raises:
    UnknownKerasClassError: `name` names nothing, or not a Keras layer class.
  """
  cls = None
  if isinstance(name, str) and name:
    if '.' in name and '>' not in name:
      module_name, _, attr = name.rpartition('.')
      try:
        cls = getattr(importlib.import_module(module_name), attr, None)
      except ImportError:
        cls = None
    else:
      cls = (keras.saving.get_registered_object(name) or
             getattr(keras.layers, name, None))
  if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
    raise UnknownKerasClassError(
        f'keras_class {name!r} is not a Keras layer class. Give an importable '
        "path ('keras.layers.Dense', 'mypackage.layers.MyBlock'), a Keras "
        "layer name ('Dense') or the registered name ('package>Name') of a "
        'class decorated with @keras.saving.register_keras_serializable.')
  return cls


def KerasClassPath(cls: type) -> str:
  """The text a KerasLayer's ``keras_class`` holds for Keras layer class `cls`.

  Raises:
    UnknownKerasClassError: `cls` can be neither imported nor looked up by a
      registered name (e.g. it was defined inside a function).
  """
  for module in ('keras.layers', 'keras'):
    if getattr(importlib.import_module(module), cls.__name__, None) is cls:
      return f'{module}.{cls.__name__}'
  registered = keras.saving.get_registered_name(cls)
  if '>' in registered and keras.saving.get_registered_object(
      registered) is cls:
    return registered
  if '<locals>' in cls.__qualname__ or '.' in cls.__qualname__:
    raise UnknownKerasClassError(
        f'Keras layer class {cls.__qualname__} cannot be named in Params: '
        'define it at the top level of a module, or register it with '
        '@keras.saving.register_keras_serializable(package=...).')
  return f'{cls.__module__}.{cls.__qualname__}'
