"""Params: ordered, documented, freezable hyperparameters with a text form.

A Params object holds named fields, each defined once with a default and a
description. Layers, pipelines and experiments are configured by Params and
built from them (``InstantiableParams.Instantiate``); a layer freezes its own
copy so configuration is never written at run time.

Text form (``ToText`` / ``FromText``), one leaf per line, in definition order::

  lr : 0.1
  encoder.dim : 512                       # nested Params: dotted names
  layers[0].cls : gpipe_tf.layers.core.FCLayer
  layers[0].name : 'fc0'                  # lists/tuples holding Params: [i]
  layers[1] : None                        # a non-Params element of such a list
  schedule : (1, 2.5, None)
  act : builtins.abs                      # classes/functions: module.QualName

Values are Python literals (None, bools, ints, floats via repr, strings and
bytes via repr, lists, tuples, dicts of those), plus ``inf``/``nan`` and dotted
references ``module.QualName`` to classes, functions and enum members, which
``FromText`` resolves by importing the longest importable module prefix.
Other values (sets, arbitrary objects, classes defined inside functions) are
written with repr for reading only; FromText rejects or may misread them.

This module deliberately does NOT type-check values, stop in-place mutation of
lists/dicts held by frozen Params, or create structure from text (see FromText).
"""

from __future__ import annotations

import ast
import copy
import difflib
import enum
import importlib
import keyword
import re
import types
from typing import Any, Callable, Iterator, Self

from gpipe_tf import errors

__all__ = ['FrozenParamsError', 'InstantiableParams', 'Params',
           'ParamsParseError', 'UnknownParamError']


class FrozenParamsError(errors.Error, TypeError):
  """A Set, Define, Delete or attribute write reached frozen Params."""


class ParamsParseError(errors.Error, ValueError):
  """FromText cannot parse a statement; the message gives its line and text."""


class UnknownParamError(errors.Error, AttributeError):
  """A path names no field (the message suggests close ones) or indexes past a
  list's end. An AttributeError, so ``hasattr`` and ``getattr`` defaults work."""


_KEY_RE = re.compile(r'[^\W\d]\w*(?:\.[^\W\d]\w*|\[\d+\])*')
_TOKEN_RE = re.compile(r'\.?([^\W\d]\w*)|\[(\d+)\]')

_Path = list  # Tokens of a param path: str for a name, int for a list index.


class Params:
  """An ordered collection of named, documented hyperparameters.

  Read and write fields as attributes (``p.dim = 4``) or by path
  (``p.Set(**{'encoder.dim': 4, 'layers[0].name': 'fc'})``). A path is names
  joined by '.', with ``[i]`` to index a list or tuple. Writing a path never
  defines a field or adds a list element; unknown names raise
  UnknownParamError (an AttributeError) naming the closest defined ones.

  ``Freeze()`` makes this object and every Params nested in it (also inside
  lists, tuples and dict values) read-only. Lists and dicts themselves are
  stored as given, so mutating one in place cannot be prevented: don't.
  """

  def __init__(self) -> None:
    object.__setattr__(self, '_values', {})
    object.__setattr__(self, '_descriptions', {})
    object.__setattr__(self, '_frozen', False)

  # ---- Fields -------------------------------------------------------------
  def Define(self, name: str, default: Any, description: str) -> None:
    """Adds field `name`.

    Raises:
      FrozenParamsError: these Params are frozen.
      ValueError: `name` is not a public identifier or shadows a method.
      AttributeError: `name` is already defined.
      TypeError: `description` is not a str.
    """
    self._CheckWritable('define', name)
    if (not isinstance(name, str) or not name.isidentifier() or
        name.startswith('_') or keyword.iskeyword(name)):
      raise ValueError(f'Invalid param name {name!r}: use a Python identifier '
                       'that is not a keyword and does not start with "_".')
    if hasattr(type(self), name):
      raise ValueError(f"Param name '{name}' clashes with "
                       f'{type(self).__name__}.{name}; pick another name.')
    if name in self._values:
      raise AttributeError(f"Param '{name}' is already defined; use Set() to "
                           'change its value.')
    if not isinstance(description, str):
      raise TypeError(f"Description of param '{name}' must be a str.")
    self._values[name] = default
    self._descriptions[name] = description

  def Set(self, /, **kwargs: Any) -> Self:
    """Sets each path (``'dim'``, ``'encoder.dim'``, ``'layers[0].dim'``).

    Applied in argument order; returns self.
    """
    for key, value in kwargs.items():
      _Assign(self, self, _ParseKey(key), 0, value, key)
    return self

  def Get(self, name: str) -> Any:
    """The value at path `name`."""
    return self._Walk(name, _ParseKey(name))

  def Delete(self, *names: str) -> Self:
    """Removes fields (paths allowed); none is removed if any is unknown."""
    owners = [self._Owner(key) for key in names]
    for (parent, name), key in zip(owners, names):
      parent._CheckWritable('delete', key)
    for parent, name in owners:
      parent._values.pop(name, None)
      parent._descriptions.pop(name, None)
    return self

  def GetDescription(self, name: str) -> str:
    """The description given to Define for path `name`."""
    parent, name = self._Owner(name)
    return parent._descriptions[name]

  def IterParams(self) -> Iterator[tuple[str, Any]]:
    """Yields (name, value) of the top-level fields in definition order."""
    yield from list(self._values.items())

  def __contains__(self, name: object) -> bool:
    try:
      self.Get(name)  # type: ignore[arg-type]
    except (AttributeError, ValueError):
      return False
    return True

  def __getattr__(self, name: str) -> Any:
    values = self.__dict__.get('_values')
    if name.startswith('_') or values is None:
      # Private and dunder lookups (copy, pickle, hasattr) fail plainly.
      raise AttributeError(name)
    if name in values:
      return values[name]
    raise _UnknownParam(self, self, [], name, name)

  def __setattr__(self, name: str, value: Any) -> None:
    _Assign(self, self, [name], 0, value, name)

  def __dir__(self) -> list[str]:
    return sorted(set(super().__dir__()) | set(self._values))

  # ---- Copy and freeze ----------------------------------------------------
  def Copy(self) -> Self:
    """A deep, unfrozen copy (nested Params, lists, tuples and dicts too)."""
    new = object.__new__(type(self))
    new.__dict__.update(self.__dict__)
    object.__setattr__(new, '_values',
                       {k: _CopyValue(v) for k, v in self._values.items()})
    object.__setattr__(new, '_descriptions', dict(self._descriptions))
    object.__setattr__(new, '_frozen', False)
    return new

  def Freeze(self) -> None:
    """Makes these Params and all nested Params read-only, for good."""
    object.__setattr__(self, '_frozen', True)
    for value in self._values.values():
      _FreezeValue(value)

  def IsFrozen(self) -> bool:
    return self._frozen

  def _CheckWritable(self, action: str, key: str) -> None:
    if self._frozen:
      raise FrozenParamsError(
          f"Cannot {action} param '{key}': the Params holding it are frozen. "
          'Change a Copy() instead.')

  # ---- Comparison and text ------------------------------------------------
  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Params):
      return NotImplemented
    return self._values == other._values

  __hash__ = None  # type: ignore[assignment]  # Mutable.

  def ToText(self) -> str:
    """One ``path : value`` line per leaf, in definition order."""
    return '\n'.join(f'{key} : {_FormatValue(value)}'
                     for key, value in _Leaves('', self))

  def __repr__(self) -> str:
    return self.ToText()

  __str__ = __repr__

  def FromText(self, text: str) -> Self:
    """Sets fields from ToText's format, in place; returns self.

    Statements are separated by newlines or by ';' (outside string literals),
    so ``'a.b : 1; c : "x;y"'`` sets two fields. Blank statements are skipped
    and '#' outside a string starts a comment running to the end of the line.

    FromText only sets values at paths that already exist: it never defines a
    field, creates a Params, or adds or removes list elements. ``layers[2].dim``
    therefore needs ``layers`` to hold at least 3 elements already, the third a
    Params with field ``dim`` (as a fresh Params from the same code does). A
    plain ``layers : [...]`` line replaces the whole value, whatever it was.
    So ``q.FromText(p.ToText()) == p`` holds when q has the same fields as p
    and the same list lengths wherever p's lists hold Params.

    Every statement is parsed before any is applied, so a parse error changes
    nothing; a later unknown path leaves the earlier statements applied.

    Raises:
      ParamsParseError: a statement lacks the ':' after its path, has an
        invalid path, or a value that is not a literal, inf/nan or an
        importable module.QualName.
      UnknownParamError: a path names no field (the message suggests close
        ones) or indexes past a list's end (an AttributeError).
      FrozenParamsError: a path reaches frozen Params.
    """
    parsed = []
    for lineno, statement in _SplitStatements(text):
      where = f'line {lineno}: {statement!r}'
      key, sep, value_text = statement.partition(':')
      if not sep:
        raise ParamsParseError(f"{where}: expected 'name : value'.")
      try:
        tokens = _ParseKey(key.strip())
      except ValueError as e:
        raise ParamsParseError(f'{where}: {e}') from None
      try:
        value = _ParseValue(value_text.strip())
      except (ValueError, TypeError, SyntaxError, ImportError,
              RecursionError) as e:
        raise ParamsParseError(f'{where}: cannot parse value: {e}') from e
      parsed.append((where, key.strip(), tokens, value))
    for where, key, tokens, value in parsed:
      try:
        _Assign(self, self, tokens, 0, value, key)
      except UnknownParamError as e:
        raise UnknownParamError(f'{where}: {e}') from e
    return self

  # ---- Paths --------------------------------------------------------------
  def _Walk(self, key: str, tokens: _Path) -> Any:
    node = self
    for depth in range(len(tokens)):
      node = _Step(self, node, tokens, depth, key)
    return node

  def _Owner(self, key: str) -> tuple[Params, str]:
    """The Params holding the field at path `key`, and the field's name."""
    tokens = _ParseKey(key)
    if isinstance(tokens[-1], int):
      raise ValueError(f'{key!r} names a list element, not a param.')
    parent = self._Walk(key, tokens[:-1])
    _Step(self, parent, tokens, len(tokens) - 1, key)  # Raises if missing.
    return parent, tokens[-1]


class InstantiableParams(Params):
  """Params with field ``cls``: ``Instantiate()`` builds ``cls(params)``.

  Instantiate passes this very object; it neither copies nor freezes it (a
  layer copies and freezes its own Params in its constructor).
  """

  def __init__(self, cls: Callable[..., Any] | None = None) -> None:
    super().__init__()
    self.Define('cls', cls,
                'What Instantiate() builds: called as cls(params, **kwargs).')

  def Instantiate(self, /, **kwargs: Any) -> Any:
    """Returns ``self.cls(self, **kwargs)``."""
    if self.cls is None:
      raise ValueError('InstantiableParams.cls is None; set it to the class '
                       'to build before calling Instantiate().')
    return self.cls(self, **kwargs)


# ---- Paths ----------------------------------------------------------------
def _ParseKey(key: str) -> _Path:
  if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
    raise ValueError(f'Invalid param path {key!r}: expected names joined by '
                     "'.' with optional [index], e.g. 'layers[0].dim'.")
  return [int(index) if index else name
          for name, index in _TOKEN_RE.findall(key)]


def _JoinKey(tokens: _Path) -> str:
  return ''.join(f'[{t}]' if isinstance(t, int) else (f'.{t}' if i else t)
                 for i, t in enumerate(tokens))


def _UnknownParam(root: Params, node: Params, prefix: _Path, name: str,
                  key: str) -> UnknownParamError:
  where = _JoinKey(prefix)
  qualify = lambda n: f'{where}.{n}' if where else n
  close = difflib.get_close_matches(name, list(node._values), n=3)
  if close:
    hint = 'Did you mean: ' + ', '.join(map(qualify, close)) + '?'
  elif node._values:
    hint = 'Defined params: ' + ', '.join(map(qualify, node._values)) + '.'
  else:
    hint = f"'{where}' defines no params." if where else 'None are defined.'
  return UnknownParamError(
      f"{type(root).__name__} has no param '{key}'. {hint}")


def _Step(root: Params, node: Any, tokens: _Path, depth: int, key: str) -> Any:
  """The child of `node` at tokens[depth]; UnknownParamError if there is none."""
  token, where = tokens[depth], _JoinKey(tokens[:depth])
  missing = f"{type(root).__name__} has no param '{key}'"
  if isinstance(token, str):
    if not isinstance(node, Params):
      raise UnknownParamError(f"{missing}: '{where}' holds a "
                              f'{type(node).__name__}, not Params.')
    if token not in node._values:
      raise _UnknownParam(root, node, tokens[:depth], token, key)
    return node._values[token]
  if not isinstance(node, (list, tuple)):
    raise UnknownParamError(f"{missing}: '{where}' holds a "
                            f'{type(node).__name__}, not a list or tuple.')
  if token >= len(node):
    raise UnknownParamError(f"{missing}: '{where}' has {len(node)} "
                            'elements; paths never add list elements.')
  return node[token]


def _Assign(root: Params, node: Any, tokens: _Path, depth: int, value: Any,
            key: str) -> Any:
  """Sets tokens[depth:] under `node` to `value`; returns the updated node.

  Checks everything before writing, so a failed assignment changes nothing.
  Lists are updated in place; a tuple is rebuilt and returned.
  """
  if isinstance(node, Params):
    node._CheckWritable('set', key)
  child = _Step(root, node, tokens, depth, key)
  if depth + 1 < len(tokens):
    value = _Assign(root, child, tokens, depth + 1, value, key)
  token = tokens[depth]
  if isinstance(node, Params):
    node._values[token] = value
  elif isinstance(node, list):
    node[token] = value
  else:
    items = list(node)
    items[token] = value
    node = tuple(items) if type(node) is tuple else type(node)(*items)
  return node


def _CopyValue(value: Any) -> Any:
  if isinstance(value, Params):
    return value.Copy()
  if type(value) is list:
    return [_CopyValue(v) for v in value]
  if type(value) is tuple:
    return tuple(_CopyValue(v) for v in value)
  if type(value) is dict:
    return {k: _CopyValue(v) for k, v in value.items()}
  return copy.deepcopy(value)


def _FreezeValue(value: Any) -> None:
  if isinstance(value, Params):
    value.Freeze()
  elif isinstance(value, (list, tuple)):
    for v in value:
      _FreezeValue(v)
  elif isinstance(value, dict):
    for v in value.values():
      _FreezeValue(v)


# ---- Text -----------------------------------------------------------------
def _HoldsParams(value: Any) -> bool:
  return isinstance(value, Params) or (
      isinstance(value, (list, tuple)) and any(map(_HoldsParams, value)))


def _Leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
  """(path, value) of each leaf: Params and lists holding Params are opened."""
  if isinstance(value, Params):
    for name, v in value._values.items():
      yield from _Leaves(f'{key}.{name}' if key else name, v)
  elif isinstance(value, (list, tuple)) and _HoldsParams(value):
    for i, v in enumerate(value):
      yield from _Leaves(f'{key}[{i}]', v)
  else:
    yield key, value


def _QualName(obj: Any) -> str:
  return f'{obj.__module__}.{obj.__qualname__}'


def _FormatValue(value: Any) -> str:
  """Text FromText reads back as an equal value (for the supported types)."""
  if isinstance(value, enum.Enum):
    return f'{_QualName(type(value))}.{value.name}'
  if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
    return _QualName(value)
  if value is None or isinstance(value, bool):
    return repr(value)
  for base in (int, float, str, bytes, complex):  # Base repr for subclasses.
    if isinstance(value, base):
      return base.__repr__(value)
  if isinstance(value, list):
    return '[' + ', '.join(map(_FormatValue, value)) + ']'
  if isinstance(value, tuple):
    inner = ', '.join(map(_FormatValue, value))
    return f'({inner},)' if len(value) == 1 else f'({inner})'
  if isinstance(value, dict):
    return '{' + ', '.join(f'{_FormatValue(k)}: {_FormatValue(v)}'
                           for k, v in value.items()) + '}'
  return repr(value).replace('\n', ' ')  # Readable; FromText may reject it.


def _SplitStatements(text: str) -> Iterator[tuple[int, str]]:
  """Yields (1-based line, statement), splitting at newlines and ';' outside
  string literals and dropping '#' comments."""
  buf: list[str] = []
  line, start, quote, i = 1, None, '', 0
  while i < len(text):
    c = text[i]
    if not quote and c in ';\n':
      if start is not None:
        yield start, ''.join(buf).strip()
      buf, start, i = [], None, i + 1
      line += c == '\n'
      continue
    if not quote and c == '#':
      end = text.find('\n', i)
      i = len(text) if end < 0 else end
      continue
    if quote and c == '\n' and len(quote) == 1:
      quote = ''  # Unterminated literal: end the statement; it fails to parse.
      continue
    if quote:
      if c == '\\':
        step = 2
      elif text.startswith(quote, i):
        step, quote = len(quote), ''
      else:
        step = 1
    elif c in '\'"':
      quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
      step = len(quote)
    else:
      step = 1
    chunk = text[i:i + step]
    if start is None and not chunk.isspace():
      start = line
    buf.append(chunk)
    line += chunk.count('\n')
    i += step
  if start is not None:
    yield start, ''.join(buf).strip()


def _ParseValue(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError, MemoryError):
    pass
  return _Evaluate(ast.parse(text, mode='eval').body)


def _Evaluate(node: ast.AST) -> Any:
  """Literals plus inf, nan and dotted module.QualName references."""
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, (ast.List, ast.Tuple)):
    items = [_Evaluate(e) for e in node.elts]
    return items if isinstance(node, ast.List) else tuple(items)
  if isinstance(node, ast.Dict) and None not in node.keys:
    return {_Evaluate(k): _Evaluate(v) for k, v in zip(node.keys, node.values)}
  if isinstance(node, ast.UnaryOp) and isinstance(node.op,
                                                   (ast.USub, ast.UAdd)):
    operand = _Evaluate(node.operand)
    if (isinstance(operand, (int, float, complex)) and
        not isinstance(operand, bool)):
      return -operand if isinstance(node.op, ast.USub) else operand
  if isinstance(node, ast.Name) and node.id in ('inf', 'nan'):
    return float(node.id)
  if isinstance(node, ast.Attribute):
    parts = []
    while isinstance(node, ast.Attribute):
      parts.append(node.attr)
      node = node.value
    if isinstance(node, ast.Name):
      return _Resolve([node.id] + parts[::-1])
  raise ValueError(f'{ast.unparse(node)!r} is not a literal, inf, nan or '
                   'module.QualName')


def _Resolve(parts: list[str]) -> Any:
  """Imports the longest importable prefix of `parts`, then gets the rest."""
  for i in range(len(parts), 0, -1):
    module_name = '.'.join(parts[:i])
    try:
      obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
      if e.name and (module_name + '.').startswith(e.name + '.'):
        continue  # This prefix is no module; try a shorter one.
      raise
    for j in range(i, len(parts)):
      try:
        obj = getattr(obj, parts[j])
      except AttributeError:
        raise ValueError(f"'{'.'.join(parts[:j])}' has no attribute "
                         f"'{parts[j]}'") from None
    return obj
  raise ValueError(f"no module to import in '{'.'.join(parts)}'")
