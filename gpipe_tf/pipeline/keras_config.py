"""The config FromKeras writes into a KerasLayer's Params for a live Keras layer: one that rebuilds it, or a named error.

A KerasLayer rebuilds its Keras layer with ``from_config(config)``, so the
config must be literals (text) and must round-trip. Not every layer's does:
keras_hub's ``ViTPatchingAndEmbedding.get_config()`` writes arguments its
constructor refuses, ``LlamaTransformerDecoder.get_config()`` reads an
attribute it never set. ``Config`` tries, in turn::

    1. layer.get_config()               literals, and from_config takes it
       ... serialised                   Keras objects in it serialised (an
                                        initializer: D-FINE), a layer class
                                        written by path where get_config()
                                        serialises a class (Swin), checked
                                        as 3 is
    2. the constructor's arguments      as Keras recorded them (_auto_config,
                                        only when all were literals)
    3. the constructor's arguments      read back from the layer's attributes
       read from the layer              of the same names (Keras objects and
                                        functions serialised, a layer class
                                        by its path), accepted only
                                        when the layer it rebuilds, given the
                                        same weights, computes the same
                                        outputs on random inputs

and a ``Lambda``'s function is written by its module and name
(keras_classes.FunctionConfig). Each candidate is rebuilt in a throwaway
graph (eagerly, when its constructor needs eager tensors) before it is
accepted.
"""

from __future__ import annotations

import inspect
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from gpipe_tf.layers import keras_classes
from gpipe_tf.layers import keras_errors
from gpipe_tf.pipeline import keras_graph

__all__ = ['CheckLiteral', 'Config', 'Plain']

_LITERALS = (type(None), bool, int, float, str)


def CheckLiteral(name: str, value: Any, where: str) -> None:
  """Raises unless `value` is built of literals Params can write as text.

  Raises:
    UnsupportedKerasLayerError: naming the first value that is not.
  """
  if isinstance(value, dict):
    for k, v in value.items():
      CheckLiteral(name, k, where)
      CheckLiteral(name, v, where)
  elif isinstance(value, (list, tuple)):
    for v in value:
      CheckLiteral(name, v, where)
  elif not isinstance(value, _LITERALS):
    raise keras_errors.UnsupportedKerasLayerError(
        f"Keras layer '{name}': its {where} holds a {type(value).__name__}, "
        'which Params cannot hold as text; give the layer a config of '
        'literals (register custom objects and serialise them by name).')


def Plain(value: Any) -> Any:
  """`value` with Keras's tracked lists and dicts (which hold the layer they
  belong to, so copying Params would copy the layer) as plain ones."""
  if isinstance(value, dict):
    return {k: Plain(v) for k, v in value.items()}
  if isinstance(value, tuple):
    return tuple(Plain(v) for v in value)
  if isinstance(value, list):
    return [Plain(v) for v in value]
  return value


def Config(layer: keras.layers.Layer, call: Any, tensors: dict, where: str
           ) -> dict:
  """The config a KerasLayer rebuilds `layer` from, without its name.

  Args:
    layer: the Keras layer.
    call: its keras_graph.Call (for the outputs check of the attributes).
    tensors: Key -> Keras tensor (shapes and dtypes of the call's inputs).
    where: names the layer in errors.

  Raises:
    KerasLambdaError: a Lambda whose function cannot be named.
    UnsupportedKerasLayerError: no candidate rebuilds the layer (the
      message says why each failed).
  """
  if isinstance(layer, keras.layers.Lambda):
    return _LambdaConfig(layer, call.name, where)
  failures = []
  for what, get in (('get_config()', layer.get_config),
                    ('get_config() serialised',
                     lambda: _Serialized(_WithClassesNamed(layer.get_config))),
                    ('its recorded constructor arguments',
                     lambda: _Recorded(layer)),
                    ('its attributes', lambda: _FromAttributes(layer))):
    try:
      config = {k: Plain(v) for k, v in get().items() if k != 'name'}
      CheckLiteral(call.name, config, 'config')
      _CheckRebuilds(type(layer), config)
      if what in ('its attributes', 'get_config() serialised'):
        _CheckSameOutputs(layer, config, call, tensors)
      return config
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f'{what}: {type(e).__name__}: {str(e)[:200]}')
  name = type(layer).__name__
  raise keras_errors.UnsupportedKerasLayerError(
      f'{where} ({name}) cannot be rebuilt from a config Params can hold '
      f"({'; '.join(failures)}): give {name} a get_config() that returns "
      'every constructor argument as literals (Keras objects serialised), '
      'so that from_config(get_config()) rebuilds it.')


def _WithClassesNamed(get_config: Any) -> dict:
  """get_config() with Keras's serialize_keras_object writing a Keras layer
  class as keras_classes.LayerClassConfig (keras_hub's Swin layers pass it
  the class of an argument, which it cannot serialise)."""
  original = keras.saving.serialize_keras_object

  def _Serialize(value):
    if isinstance(value, type) and issubclass(value, keras.layers.Layer):
      return keras_classes.LayerClassConfig(value)
    return original(value)

  modules = (keras.saving, keras.utils)
  saved = [m.serialize_keras_object for m in modules]
  try:
    for m in modules:
      m.serialize_keras_object = _Serialize
    config = get_config()
  finally:
    for m, fn in zip(modules, saved):
      m.serialize_keras_object = fn
  return config


def _CheckRebuilds(cls: type, config: dict) -> None:
  """from_config(config) in a throwaway graph (nothing built is kept), or
  eagerly when the constructor computes on tensors as NumPy arrays, which
  a graph cannot (keras_hub's DINOV3Encoder, SmolLM3DecoderLayer); raises
  the eager failure."""
  try:
    with tf.Graph().as_default():
      keras_classes.FromConfig(cls, dict(config, name='check'))
  except Exception:  # pylint: disable=broad-except
    keras_classes.FromConfig(cls, dict(config, name='check'))


def _LambdaConfig(layer: keras.layers.Lambda, name: str, where: str) -> dict:
  """A Lambda's config with its function named by module (keras_classes)."""
  fn = layer.function
  found = keras_classes.FunctionConfig(fn)
  config = {k: v for k, v in layer.get_config().items() if k != 'name'}
  shape = config.get('output_shape')
  if found is None or (isinstance(shape, dict) and
                       shape.get('class_name') == '__lambda__'):
    what = (f"function {getattr(fn, '__qualname__', fn)!r}" if found is None
            else 'output_shape function')
    raise keras_errors.KerasLambdaError(
        f'{where} (Lambda) calls {what}, which cannot be named in Params (a '
        'lambda or a nested function), so no pipeline can rebuild it: define '
        'it with def at the top level of a module and pass that to Lambda '
        '(or register it with @keras.saving.register_keras_serializable()), '
        'or write a keras.layers.Layer subclass.')
  config['function'] = found
  config = Plain(config)
  CheckLiteral(name, config, 'config')
  return config


def _Recorded(layer: keras.layers.Layer) -> dict:
  auto = getattr(layer, '_auto_config', None)
  if auto is None:
    raise ValueError('Keras recorded none, as one is not a literal')
  return dict(auto.config)


def _Serialized(value: Any) -> Any:
  if isinstance(value, _LITERALS):
    return value
  if isinstance(value, (list, tuple)):
    return [_Serialized(v) for v in value]
  if isinstance(value, dict):
    return {k: _Serialized(v) for k, v in value.items()}
  if isinstance(value, keras.DTypePolicy):
    return value.name
  if isinstance(value, type) and issubclass(value, keras.layers.Layer):
    return keras_classes.LayerClassConfig(value)  # Swin's norm_layer.
  return keras.saving.serialize_keras_object(value)


def _FromAttributes(layer: keras.layers.Layer) -> dict:
  """The constructor's arguments read from the layer's attributes of the
  same names; an argument with a default and no attribute keeps its
  default (the outputs check catches one that mattered)."""
  params = inspect.signature(type(layer).__init__).parameters
  config, _ = keras_classes.Accepted(type(layer), {  # Flux's takes neither.
      'dtype': layer.dtype_policy.name, 'trainable': layer.trainable})
  for name, param in params.items():
    if name == 'self' or param.kind in (param.VAR_KEYWORD,
                                        param.VAR_POSITIONAL):
      continue
    if name in layer.__dict__ or hasattr(type(layer), name) and not callable(
        getattr(type(layer), name)):
      config[name] = _Serialized(getattr(layer, name))
    elif param.default is param.empty:
      raise ValueError(f'argument {name!r} has no attribute of its name')
  return config


def _CheckSameOutputs(layer: keras.layers.Layer, config: dict, call: Any,
                      tensors: dict) -> None:
  """Raises ValueError unless the layer `config` rebuilds, with `layer`'s
  weights, gives `layer`'s outputs (training=False) on random inputs."""
  rng = np.random.default_rng(0)

  def _Value(key):
    t = tensors[key]
    shape = [2 if i == 0 and d is None else 4 if d is None else d
             for i, d in enumerate(t.shape)]
    dtype = keras.backend.standardize_dtype(t.dtype)
    if 'int' in dtype or dtype == 'bool':
      return tf.constant(rng.integers(0, 2, shape), dtype)
    return tf.constant(rng.normal(size=shape), dtype)

  def _Fill(value):
    if isinstance(value, keras_graph.Key):
      return _Value(value)
    if isinstance(value, (list, tuple)):
      return type(value)(_Fill(v) for v in value)
    if isinstance(value, dict):
      return {k: _Fill(v) for k, v in value.items()}
    return value

  args = _Fill(tuple(call.args))
  kwargs = {k: v for k, v in _Fill(dict(call.kwargs)).items()
            if k != 'training'}
  clone = keras_classes.FromConfig(type(layer), dict(config, name='check'))
  clone(*args, **kwargs)
  clone.set_weights(layer.get_weights())
  want = tf.nest.flatten(layer(*args, training=False, **kwargs))
  got = tf.nest.flatten(clone(*args, training=False, **kwargs))
  if len(want) != len(got) or not all(
      np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(want, got)):
    raise ValueError('the layer it rebuilds computes other outputs')
