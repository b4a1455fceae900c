"""Keras layer classes named in Params: a class from its text (ResolveKerasClass), the text of a class (KerasClassPath), and a layer from its class and config (FromConfig).

A function in a config (a ``Lambda``'s) is written as Keras writes a
function, ``{'class_name': 'function', 'config': name, 'module': ...}``.
Keras finds only registered functions and its own by that text; FromConfig
also imports a function from its module by name (``'mypackage.fns'``,
``'Double'``), so an unregistered module-level function round-trips too.
"""

from __future__ import annotations

import importlib
from typing import Any

import keras

from gpipe_tf.layers.keras_errors import UnknownKerasClassError

__all__ = ['FromConfig', 'FunctionConfig', 'KerasClassPath',
           'ResolveKerasClass']


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


def FunctionConfig(fn: Any) -> dict | None:
  """The config FromConfig rebuilds function `fn` from: Keras's own for a
  registered or Keras function, else its module and name; None for a
  function nothing can import by name (a lambda, a nested function)."""
  registered = keras.saving.get_registered_name(fn)
  if registered != getattr(fn, '__name__', None) and (
      keras.saving.get_registered_object(registered) is fn):
    return keras.saving.serialize_keras_object(fn)
  qualname = getattr(fn, '__qualname__', '')
  module = getattr(fn, '__module__', None)
  if not module or '<' in qualname or '.' in qualname:
    return None
  try:
    found = getattr(importlib.import_module(module), qualname, None)
  except ImportError:
    found = None
  if found is not fn:
    return None
  return {'module': module, 'class_name': 'function', 'config': qualname,
          'registered_name': 'function'}


def _Functions(config: Any) -> dict:
  """name -> function for each importable function config in `config`."""
  found = {}
  if isinstance(config, dict):
    module = config.get('module')
    if (config.get('class_name') == 'function' and
        isinstance(config.get('config'), str) and isinstance(module, str) and
        module.split('.')[0] not in ('builtins', 'keras')):
      try:
        fn = getattr(importlib.import_module(module), config['config'], None)
      except ImportError:
        fn = None
      if callable(fn):
        found[config['config']] = fn
    for value in config.values():
      found.update(_Functions(value))
  elif isinstance(config, (list, tuple)):
    for value in config:
      found.update(_Functions(value))
  return found


def FromConfig(cls: type, config: dict) -> keras.layers.Layer:
  """``cls.from_config(config)``, with the functions the config names by
  module imported (module docstring)."""
  with keras.saving.custom_object_scope(_Functions(config)):
    return cls.from_config(dict(config))
