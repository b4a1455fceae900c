"""Keras BatchNormalization and Dropout as this project's BatchNormLayer and DropoutLayer (see keras_layer's docstring for why)."""

from __future__ import annotations

from typing import Sequence

import keras

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers.keras_errors import UnsupportedKerasLayerError

__all__ = ['NativeParams']

Shape = base_layer.Shape

# Keras initialisers BatchNormLayer starts from (their class names).
_BATCH_NORM_INITS = {'gamma_initializer': 'Ones', 'beta_initializer': 'Zeros',
                     'moving_mean_initializer': 'Zeros',
                     'moving_variance_initializer': 'Ones'}


def NativeParams(p: hyperparams.Params, cls: type, shapes: Sequence[Shape]
                  ) -> hyperparams.InstantiableParams | None:
  """This project's layer standing in for Keras BatchNormalization or
  Dropout (module docstring), or None for every other class."""
  if cls is not keras.layers.Dropout and not issubclass(
      cls, keras.layers.BatchNormalization):
    return None  # Dropout's subclasses (SpatialDropout*) run as Keras's.
  where = f"KerasLayer '{p.name}' ({cls.__name__})"
  if cls is not keras.layers.Dropout and (
      cls is not keras.layers.BatchNormalization):
    raise UnsupportedKerasLayerError(
        f'{where} subclasses {cls.__mro__[1].__name__}, which is run as this '
        "project's own layer; a subclass's changes would be lost. Use the "
        'Keras class itself.')
  one = (len(shapes) == 1 if p.inputs is None else
         len(p.inputs) == 1 and isinstance(p.inputs[0], int))
  if not one or p.input_kwargs or p.call_kwargs:
    raise UnsupportedKerasLayerError(
        f'{where} takes one tensor input; set inputs to one index (or None '
        'for a single input) and no input_kwargs or call_kwargs.')
  shape = shapes[0 if p.inputs is None else p.inputs[0]]
  c = p.config
  base = dict(random_seed=p.random_seed, dtype=p.dtype)
  if cls is keras.layers.Dropout:
    noise = c.get('noise_shape')
    dims = [i for i, d in enumerate(noise) if d == 1] if noise else None
    return core.DropoutLayer.Params().Set(
        keep_prob=1.0 - float(c.get('rate', 0.0)),
        noise_shape_broadcast_dims=dims, **base)
  rank = len(shape)
  axis = c.get('axis', -1)
  axis = list(axis) if isinstance(axis, (list, tuple)) else [axis]
  problems = ([f"renorm={c['renorm']!r} (use False)"]
              if c.get('renorm', False) else [])
  if [a % rank for a in axis] != [rank - 1]:
    problems.append(f'axis={c.get("axis")!r} (use -1)')
  for key, want in _BATCH_NORM_INITS.items():
    init = c.get(key)
    got = init.get('class_name') if isinstance(init, dict) else init
    if key.startswith(('gamma', 'beta')) and not c.get(
        'scale' if key.startswith('gamma') else 'center', True):
      continue  # No such variable.
    if got is not None and str(got).lower() != want.lower():
      problems.append(f'{key}={got!r} (use {want!r})')
  if problems:
    raise UnsupportedKerasLayerError(
        f"{where} runs as gpipe_tf's BatchNormLayer, which needs: "
        + ', '.join(problems) + '.')
  return normalization.BatchNormLayer.Params().Set(
      dim=int(shape[-1]), decay=float(c.get('momentum', 0.99)),
      scale=bool(c.get('scale', True)), center=bool(c.get('center', True)),
      epsilon=float(c.get('epsilon', 1e-3)),
      cross_replica_normalization=bool(c.get('synchronized', False)), **base)
