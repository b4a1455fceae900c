"""Flat lists with None leaves: the present values, and putting values back at their places.

A cell's flat inputs, outputs and gradients hold None where there is no
tensor (a None input, an integer output's gradient). Functions, loops and
conds take tensors only, so the engine passes the present ones and puts them
back where they were::

    flat   = [a, None, b]
    Present(flat)              -> [a, b]
    Fill(flat, [a2, b2])       -> [a2, None, b2]
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


def Present(flat: Iterable[Any]) -> list:
  """The non-None leaves of `flat`, in order."""
  return [x for x in flat if x is not None]


def Fill(template: Sequence[Any], values: Iterable[Any]) -> list:
  """`values`, in order, at the non-None places of `template`; None
  elsewhere.

  Raises:
    ValueError: `values` holds fewer or more items than `template` has
      non-None leaves.
  """
  values = iter(values)
  try:
    out = [None if t is None else next(values) for t in template]
  except StopIteration:
    raise ValueError('fewer values than non-None leaves') from None
  if next(values, None) is not None:
    raise ValueError('more values than non-None leaves')
  return out
