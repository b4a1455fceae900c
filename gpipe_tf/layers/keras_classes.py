"""Keras layer classes named in Params: a class from its text (ResolveKerasClass), the text of a class (KerasClassPath), and a layer from its class and config (FromConfig).

A function in a config (a ``Lambda``'s) is written as Keras writes a
function, ``{'class_name': 'function', 'config': name, 'module': ...}``.
Keras finds only registered functions and its own by that text; FromConfig
also imports a function from its module by name (``'mypackage.fns'``,
``'Double'``), so an unregistered module-level function round-trips too.
A Keras layer *class* given as an argument (keras_hub's Swin
``PatchEmbedding(norm_layer=LayerNormalization)``) is written
``{'class_name': 'keras_layer_class', 'config': KerasClassPath(cls)}``
(LayerClassConfig); FromConfig passes the class itself, or its name with
the class in Keras's custom objects to a from_config that deserialises it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import keras

from gpipe_tf.layers.keras_errors import UnknownKerasClassError

__all__ = ['Accepted', 'FromConfig', 'FunctionConfig', 'KerasClassPath',
           'LayerClassConfig', 'ResolveKerasClass']

_LAYER_CLASS = 'keras_layer_class'


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


def LayerClassConfig(cls: type) -> dict:
  """The text FromConfig turns back into Keras layer class `cls` (an
  argument that is a class, not a layer).

  Raises:
    UnknownKerasClassError: as KerasClassPath.
  """
  return {'class_name': _LAYER_CLASS, 'config': KerasClassPath(cls)}


def _LayerClasses(config: Any, found: dict, named: bool) -> Any:
  """`config` with each LayerClassConfig replaced by its class (`named`:
  by its path, the class added to `found` under it)."""
  if isinstance(config, dict):
    if config.get('class_name') == _LAYER_CLASS and set(config) == {
        'class_name', 'config'}:
      found[config['config']] = ResolveKerasClass(config['config'])
      return config['config'] if named else found[config['config']]
    return {k: _LayerClasses(v, found, named) for k, v in config.items()}
  if isinstance(config, (list, tuple)):
    return type(config)(_LayerClasses(v, found, named) for v in config)
  return config


def FromConfig(cls: type, config: dict) -> keras.layers.Layer:
  """``cls.from_config(config)``, with the functions the config names by
  module imported and its layer classes resolved (module docstring).

  A layer class is passed as the class; if from_config refuses that (one
  that deserialises the argument itself, as Swin's PatchEmbedding does), as
  its name with the class in Keras's custom objects, as Keras names an
  object in a config. A constructor that takes no `name`, `dtype` or
  `trainable` (nor **kwargs) is not given them; the layer gets its name
  after.
  """
  config, name = Accepted(cls, config)
  layer = _FromConfig(cls, config)
  if name is not None:
    layer.name = name  # Before it is built: its weights' paths use it.
  return layer


# Layer.__init__'s own arguments, which get_config() writes and a
# constructor without **kwargs (keras_hub's Flux MLPEmbedder) cannot take.
_BASE_ARGUMENTS = ('name', 'dtype', 'trainable')


def Accepted(cls: type, config: dict) -> tuple[dict, str | None]:
  """(`config` less the base arguments `cls`'s constructor does not take,
  the name to give the layer after it is built from it, else None)."""
  params = inspect.signature(cls.__init__).parameters
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return config, None
  dropped = [k for k in _BASE_ARGUMENTS if k in config and k not in params]
  name = config.get('name') if 'name' in dropped else None
  return {k: v for k, v in config.items() if k not in dropped}, name


def _FromConfig(cls: type, config: dict) -> keras.layers.Layer:
  objects = _Functions(config)
  classes = {}
  resolved = _LayerClasses(dict(config), classes, named=False)
  with keras.saving.custom_object_scope(objects):
    if not classes:
      return cls.from_config(resolved)
    try:
      return cls.from_config(resolved)
    except Exception:  # pylint: disable=broad-except
      pass
  named = _LayerClasses(dict(config), classes, named=True)
  with keras.saving.custom_object_scope({**objects, **classes}):
    return cls.from_config(named)
