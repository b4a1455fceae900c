"""Flat lists with None leaves: the present values, and putting values back at their places.

A cell's flat inputs, outputs and gradients hold None where there is no
tensor (a None input, an integer output's gradient). Functions, loops and
conds take tensors only, so the engine passes the present ones and puts them
back where they were::

    flat   = [a, None, b]
    Present(flat)              -> [a, b]
    Fill(flat, [a2, b2])       -> [a2, None, b2]
    FillEach([flat, [c, None]], [a2, b2, c2])
                               -> [[a2, None, b2], [c2, None]]
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
  return FillEach([template], values)[0]


def FillEach(templates: Sequence[Sequence[Any]], values: Iterable[Any]
             ) -> list[list]:
  """`values`, in order, at the non-None places of each template in turn
  (one list per template, as Fill's): a function's flat arguments back in
  the lists they were made of.

  Raises:
    ValueError: `values` holds fewer or more items than the templates have
      non-None leaves.
  """
  values = iter(values)
  try:
    out = [[None if t is None else next(values) for t in template]
           for template in templates]
  except StopIteration:
    raise ValueError('fewer values than non-None leaves') from None
  if next(values, None) is not None:
    raise ValueError('more values than non-None leaves')
  return out
