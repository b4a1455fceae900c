"""The output shapes of a Keras layer call as its `call` makes them, where its declared shapes say otherwise.

Keras gives a layer called on symbolic tensors the shapes of its
``compute_output_shape`` (or ``compute_output_spec``) when the layer's class
defines one, and does not run ``call``. A class from outside Keras may get it
wrong: keras_hub's ``SigLIPVisionEmbedding`` declares a class-token position
it does not make, ``XLNetAttentionMaskLayer`` declares its rank-3 masks
rank 2, ``MoonshineRotaryEmbedding`` keeps its input's rank. A pipeline built
from those shapes declares inputs its next layers never get.

``OutputSpecs(layer, args, kwargs, declared)`` keeps Keras's declared specs
unless the layer's class (or one of its bases outside Keras) defines its own
shape inference; then it traces ``layer(...)`` once on placeholders of the
argument shapes (Keras's ``compute_output_spec``: a scratch tf.FuncGraph,
nothing computed, no variable written) and takes the traced specs where they
differ from the declared ones: another rank, or a size the trace knows. A
size only the declared spec knows stays if a second trace, with the
unknown argument sizes set to a probe size, makes it too, and becomes
unknown if not (XLNet declares 1 for a length of twice the sequence).

This module deliberately does NOT trace Keras's own layers (their shapes are
Keras's tested contract, and tracing every layer would slow FromKeras) nor
change a spec a trace cannot make: a call that fails on placeholders keeps
the declared specs, and a pipeline built from them still checks each
layer's inputs when it runs.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras

__all__ = ['Disagrees', 'OutputSpecs', 'OwnsShapes']

_SHAPE_METHODS = ('compute_output_shape', 'compute_output_spec')
# The size an unknown dimension gets in the probing trace (OutputSpecs).
_PROBE = 5


def OwnsShapes(layer: Any) -> bool:
  """Whether `layer`'s class takes its output shapes from a method defined
  outside Keras (a keras_hub layer's compute_output_shape, say) rather than
  from Keras's own layers or a trace of `call`."""
  for klass in type(layer).__mro__:
    if klass.__module__.startswith(('keras.', 'keras_core.')):
      return False
    if any(m in vars(klass) for m in _SHAPE_METHODS):
      return True
  return False


def Disagrees(declared: Any, traced: Any) -> bool:
  """Whether two shapes differ in rank or in a size both know."""
  if declared is None or traced is None:
    return False
  declared, traced = tuple(declared), tuple(traced)
  if len(declared) != len(traced):
    return True
  return any(a is not None and b is not None and a != b
             for a, b in zip(declared, traced))


def _Trace(layer: Any, args: Any, kwargs: dict) -> list | None:
  """The flat specs a trace of `layer(*args, **kwargs)` makes on
  placeholders, or None when it cannot trace or makes no Keras tensors."""
  try:
    traced = keras.tree.flatten(keras.src.backend.compute_output_spec(
        lambda *a, **k: layer(*a, **k), *args, **kwargs))
  except Exception:  # pylint: disable=broad-except
    # A call that needs real values keeps the declared specs (docstring).
    return None
  if not all(isinstance(t, keras.KerasTensor) for t in traced):
    return None
  return traced


def _Sized(value: Any) -> Any:
  """`value` with each Keras tensor's unknown sizes set to _PROBE."""
  return keras.tree.map_structure(
      lambda t: keras.KerasTensor(
          tuple(_PROBE if d is None else d for d in t.shape), t.dtype)
      if isinstance(t, keras.KerasTensor) else t, value)


def OutputSpecs(layer: Any, args: Sequence[Any], kwargs: dict,
                declared: Sequence[Any], trace: bool = False) -> list:
  """The flat output specs (Keras tensors) of calling `layer` (a layer or
  an operation) on the Keras tensors in `args` and `kwargs`: `declared`
  (Keras's, flat), or the specs its `call` makes where they disagree
  (module docstring). `trace`: trace it whatever its class (its arguments'
  shapes are not those Keras declared it for).

  A size the declared spec knows and the trace leaves unknown is checked by
  a second trace with every unknown argument size set to _PROBE: kept if
  that trace makes it too (a size fixed by the layer), unknown if not (it
  follows the input: XLNet's relative positions, declared 1)."""
  declared = list(declared)
  if not trace and not OwnsShapes(layer):
    return declared
  traced = _Trace(layer, args, kwargs)
  if traced is None or len(traced) != len(declared):
    return declared
  loose = any(len(d.shape) == len(t.shape) and any(
      a is not None and b is None for a, b in zip(d.shape, t.shape))
              for d, t in zip(declared, traced))
  probed = _Trace(layer, _Sized(args), _Sized(kwargs)) if loose else None
  if probed is not None and len(probed) != len(traced):
    probed = None
  out = []
  for i, (d, t) in enumerate(zip(declared, traced)):
    shape = tuple(t.shape)
    if len(d.shape) == len(shape):
      p = tuple(probed[i].shape) if probed is not None else None
      shape = tuple(
          a if b is None and a is not None and (
              p is None or len(p) != len(shape) or p[j] == a) else b
          for j, (a, b) in enumerate(zip(d.shape, shape)))
    out.append(d if tuple(d.shape) == shape else
               keras.KerasTensor(shape, t.dtype))
  return out
