"""One trace per kind of layer: identical layers call one traced function with their own variables.

A deep model repeats one block L times. Traced as written, each block is a
fresh Python trace of its forward and of its gradient, so building a step
costs L traces. Here a layer whose class sets ``SHARE_TRACE = True`` is
traced once per *kind* (class, Params apart from the name, input specs and
which inputs a tape differentiates, training) into three functions, and
every layer of that kind calls them with its own variables::

    forward   F(step seed, layer seeds, x)      -> y, saved
    backward  B(x, y, saved, dy)                -> dx, wcut  (what it reads)
    weights   W(wcut)                           -> dws

The three are pruned from one graph of the layer's forward and gradient, so
together they compute exactly the ops a traced layer computes (the cut is
cell_program's: ``saved`` are the forward tensors the backward reads,
``wcut`` what the weight-gradient ops read from the input-gradient ones).
A call records itself on the gradient tape as one operation whose gradient
calls B then W, so a graph pruned between a backward's roles (a pipeline
piece) finds each layer's B and W as separate calls: a pipeline cell's
pieces are pruned from such calls, and ``InlinedSize`` weighs a piece by the
ops of each call that make what the piece reads (docs/scale.md).

The functions keep the variables the kind was traced with as captured
inputs; a call passes the calling layer's variables in their place (the
same attribute paths, in tf.Module's order). Variable names, checkpoints
and values are untouched: each layer still owns its variables.

Randomness: the step seed in scope (random_seeds.StepSeedScope) and the
``layer_seed`` of the layer and each of its sub-layers are arguments of F,
so a layer's dropout masks are those it draws traced on its own.

What is not shared (traced as written, as before): a layer called in
inference (training=False: no gradient to trace, and a served model keeps
no shared call); a layer whose class does not opt in; one with non-trainable variables (BatchNorm's moving
statistics); one that adds auxiliary losses (aux_losses); one whose trace captures anything but its own variables; any
layer outside a tf.function, under a distribution strategy or a
mixed-precision policy; one drawing random numbers with no step seed in
scope; and everything inside ``Off()``. A class opts in when its FProp is a
function of its Params, its inputs and its variables only (no Python state
that differs between two layers of the same Params), see docs/scale.md.
Traced kinds are kept for the process (they hold the layer they were traced
from); ``Stats.Reset()`` drops them, and their copies made to be called whole.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import precision
from gpipe_tf.layers import prune
from gpipe_tf.layers import random_seeds

# Private TensorFlow APIs, all used here and pinned by
# tests/layers/shared_trace_test.py: a call records itself on the tape
# (record.record_operation) instead of letting TensorFlow differentiate the
# function call, with recording stopped while the call is made; the caller's
# variables are marked as read (resource_variable_ops.variable_accessed) so that a tape
# watches them; and a function is called with other captured inputs
# (ConcreteFunction._call_flat).
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

__all__ = ['CalledGraph', 'CallsKeptWhole', 'CellsCallWhole', 'InlinedSize',
           'NOT_SHARED', 'Off', 'SharedCall', 'SharedTraceSaveError', 'Stats',
           'WholeInCells']

_OFF: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_trace_off', default=False)


@contextlib.contextmanager
def Off() -> Iterator[None]:
  """Every layer called in here is traced on its own."""
  token = _OFF.set(True)
  try:
    yield
  finally:
    _OFF.reset(token)


_WHOLE: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_trace_whole', default=False)


_CELLS_WHOLE: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_trace_cells_whole', default=False)


@contextlib.contextmanager
def WholeInCells() -> Iterator[None]:
  """Pipeline cells traced in here call their layers' shared traces whole
  instead of inlining them into the step (`PipeliningLayer` Param
  `whole_layer_calls`)."""
  token = _CELLS_WHOLE.set(True)
  try:
    yield
  finally:
    _CELLS_WHOLE.reset(token)


def CellsCallWhole() -> bool:
  """Whether pipeline cells traced now call their layers whole."""
  return _CELLS_WHOLE.get()


@contextlib.contextmanager
def CallsKeptWhole() -> Iterator[None]:
  """Shared traces called in here are called whole: TensorFlow neither
  inlines the calls nor copies the function per call (prune.KeptWhole), so
  a graph of many calls of one kind holds its ops once per device, not
  once per call. A pipeline cell calls its layers so under WholeInCells()
  (docs/scale.md)."""
  token = _WHOLE.set(True)
  try:
    yield
  finally:
    _WHOLE.reset(token)


# A traced function's name -> the same function called whole.
_WHOLE_OF: dict = {}


def _KeptWhole(function: Any, kind: '_Kind') -> Any:
  name = tf.compat.as_str(function.name)
  if name not in _WHOLE_OF:
    whole = prune.KeptWhole(function)
    # Found, weighed and differentiated as the function it calls
    # (CalledGraph, InlinedSize, _ForwardGradient).
    whole_name = tf.compat.as_str(whole.name)
    _GRAPHS[whole_name] = function.graph
    if function is kind.forward:
      _BY_NAME[whole_name] = kind
    _WHOLE_OF[name] = whole
  return _WHOLE_OF[name]


@dataclasses.dataclass
class Stats:
  """How many kinds were traced, how many layer calls used them and how
  many runs of them were loops (layers/shared_run.py) (process-wide;
  `Stats.Reset()` clears the counters and the traced kinds)."""
  traces: int = 0
  calls: int = 0
  runs: int = 0

  @classmethod
  def Reset(cls) -> None:
    _STATS.traces = _STATS.calls = _STATS.runs = 0
    _KINDS.clear()
    _WHOLE_OF.clear()  # Each held a dropped kind's function, whole.

  @classmethod
  def Get(cls) -> 'Stats':
    return dataclasses.replace(_STATS)


_STATS = Stats()


class SharedTraceSaveError(errors.Error, ValueError):
  """A SavedModel was asked to keep a shared trace's gradient."""


class _Unshareable(Exception):
  """This layer's trace cannot be called with another layer's variables."""


@dataclasses.dataclass(frozen=True)
class _Kind:
  """One kind's traced functions (module docstring)."""
  forward: Any
  backward: Any | None  # None: no input gradient; W does all.
  weights: Any | None  # None: B computes dws too (W reads what B cannot cut).
  num_y: int
  dx_present: tuple[bool, ...]
  variables: tuple  # The template layer's, in order.
  names: tuple  # Their paths below the layer, shapes and dtypes.
  kept: tuple  # Per tensor B reads: its index in inputs + outputs, or None
  #              for the next of the forward's saved outputs.
  w_reads: tuple  # Per tensor W reads: its index in B's arguments (W is
  #                 given it by the caller), or None for B's next output.
  out_struct: Any  # The nest FProp returned.
  random: bool  # Whether the forward reads the seeds (draws random numbers).


# Kind key -> _Kind, or None for a kind found unshareable.
_KINDS: dict = {}
# A traced function's name -> its graph.
_GRAPHS: dict = {}
_CALLS = ('PartitionedCall', 'StatefulPartitionedCall')


def CalledGraph(op: tf.Operation) -> tf.Graph | None:
  """The graph of the shared trace `op` calls, or None."""
  return (_GRAPHS.get(op.get_attr('f').name) if op.type in _CALLS else None)


def InlinedSize(graph: tf.Graph, as_built: bool = False) -> int:
  """The ops of `graph` once the calls of shared traces in it are inlined
  (what a piece of a cell's program adds to a step): of a call, the ops of
  its trace that make the outputs the piece uses, as TensorFlow keeps them
  after inlining. Counting whole traces would count a forward's saved
  tensors where only its outputs are read, twice a piece's real size, and
  a step's plan (periods.Plan) would fold what it builds whole.

  A loop over a run of layers (layers/shared_run.py) weighs the ops of
  the layers it stands for; `as_built`, the ops it holds (one copy of its
  body)."""
  fetched = {id(t) for t in getattr(graph, 'outputs', ())}
  total = 0
  for op in graph.get_operations():
    called = CalledGraph(op)
    if called is None:
      total += 1
      continue
    name = op.get_attr('f').name
    used = tuple(i for i, y in enumerate(op.outputs)
                 if y.consumers() or id(y) in fetched)
    if name in _REGISTERED:  # A loop (layers/shared_run.py): its size,
      #                        unless it is dead (a prune copies some in).
      total += _REGISTERED[name][1 if as_built else 0] if used else 0
      continue
    key = (op.get_attr('f').name, used)
    if key not in _SIZES:
      outputs = [called.outputs[i] for i in used]
      _SIZES[key] = len(_Ancestors(outputs, set(called.get_operations())))
    total += _SIZES[key]
  return total


# Ops whose output shares its input's buffer (TensorFlow forwards it): a
# tensor made by one holds no memory of its own beside its input.
VIEW_OPS = frozenset({'Reshape', 'ExpandDims', 'Squeeze', 'Identity',
                      'IdentityN', 'StopGradient', 'EnsureShape'})


def ViewedTensor(x: tf.Tensor) -> tf.Tensor:
  """The tensor whose buffer `x`, made by a VIEW_OPS op, shares."""
  return x.op.inputs[x.value_index if x.op.type == 'IdentityN' else 0]


def Root(x: tf.Tensor) -> tf.Tensor:
  """`x` with views followed back to the tensor that owns the buffer
  (within one graph)."""
  while x.op.type in VIEW_OPS:
    x = ViewedTensor(x)
  return x


# (a traced function's name, the outputs a call uses) -> the ops kept.
_SIZES: dict = {}
# A function of another module's making (layers/shared_run.py) -> (the ops
# it weighs, the ops it adds to a step once inlined).
_REGISTERED: dict = {}


def Register(function: Any, size: int, built: int) -> None:
  """Makes calls of `function` found by CalledGraph and weighed `size` ops
  by InlinedSize, `built` as_built (layers/shared_run.py's loops)."""
  name = tf.compat.as_str(function.name)
  _GRAPHS[name] = function.graph
  _REGISTERED[name] = (size, built)
  function.graph.variables = []


def LiveSize(graph: tf.Graph) -> int:
  """The ops of `graph` that make its outputs."""
  return len(_Ancestors(graph.outputs, set(graph.get_operations())))


def _SubLayers(layer: Any) -> list:
  """`layer` and its sub-layers that have a layer_seed, in tf.Module order."""
  return [layer] + [m for m in layer.submodules if hasattr(m, 'layer_seed')]


def ParamsText(layer: Any) -> str:
  """`layer`'s Params as text, its name left out: equal for layers of one
  kind."""
  params = layer.params.Copy()
  params.name = ''
  return params.ToText()


def _Key(layer: Any, xs: Sequence[Any], training: bool) -> tuple | None:
  if not getattr(type(layer), 'SHARE_TRACE', False):
    return None
  if any(not v.trainable for v in layer.variables):
    return None
  # Per input, its spec and whether a tape wants its gradient (a layer whose
  # input gradient nobody reads, the first of a model, is traced without).
  specs = tuple((tuple(x.shape.as_list()), x.dtype.name,
                 x.dtype.is_floating and record.should_record_backprop([x]))
                for x in xs)
  return (type(layer), ParamsText(layer), specs, training)


def Relative(layer: Any, variables: Sequence[tf.Variable] | None = None
             ) -> tuple:
  """Per trainable variable of `layer` (`variables`, where the caller has
  them: a module's are found by walking it), its path below the layer,
  shape and dtype: a layer calls its kind's trace when these are the
  kind's."""
  if variables is None:
    variables = layer.trainable_variables
  prefix = layer.path + '/'
  return tuple((v.name[len(prefix):] if v.name.startswith(prefix) else None,
                tuple(v.shape.as_list()), v.dtype.name) for v in variables)


def LayerSeeds(layer: Any) -> list:
  """The layer seeds a call of `layer` passes its kind's forward."""
  return [m.layer_seed for m in _SubLayers(layer)]


def IsTupleOf(struct: Any, n: int) -> bool:
  """Whether a layer returning `struct` returns n tensors as
  core.AsTuple reads them (one tensor, or a flat tuple)."""
  if isinstance(struct, tuple):
    return len(struct) == n and not any(
        tf.nest.is_nested(s) for s in struct)
  return n == 1 and not tf.nest.is_nested(struct)


def CountRun(n: int) -> None:
  """Counts a run of n layers called as one loop (layers/shared_run.py)."""
  _STATS.calls += n
  _STATS.runs += 1


def _Trace(layer: Any, fprop: Callable[..., Any], xs: Sequence[tf.Tensor],
           wanted: Sequence[bool]) -> _Kind:
  """Traces `layer`'s forward and gradient once and cuts F, B and W."""
  variables = list(layer.trainable_variables)
  subs = _SubLayers(layer)
  got: dict = {}

  def _Body(step_seed, layer_seeds, *args):
    args = list(args)
    with tf.GradientTape() as tape:
      tape.watch(args)
      with random_seeds.LayerSeedsScope(
          {id(m): layer_seeds[i] for i, m in enumerate(subs)}):
        with random_seeds.StepSeedScope(step_seed), (
            aux_losses.Collect()) as aux:
          out = fprop(*args)
      if aux.terms:  # Auxiliary losses would stay inside the trace.
        raise _Unshareable()
      got['struct'] = out
      ys = tf.nest.flatten(out)
    graph = tf.compat.v1.get_default_graph()
    got['mark'] = len(graph.get_operations())
    dys = [tf.compat.v1.placeholder(y.dtype, y.shape) if y.dtype.is_floating
           else None for y in ys]
    pairs = [(y, g) for y, g in zip(ys, dys) if g is not None]
    floats = [x for x, w in zip(args, wanted) if w]
    grads = tape.gradient([y for y, _ in pairs], floats + variables,
                          output_gradients=[g for _, g in pairs])
    dx = iter(grads[:len(floats)])
    got.update(xs=args, ys=ys, dys=[g for g in dys if g is not None],
               dxs=[next(dx) if w else None for w in wanted],
               dws=[_Dense(g, v) for g, v in zip(grads[len(floats):],
                                                 variables)])
    return ys

  with tf.device(None):
    wrapped = tf.compat.v1.wrap_function(
        _Body, [tf.TensorSpec([2], tf.int64),
                tf.TensorSpec([len(subs)], tf.int32)] +
        [tf.TensorSpec(x.shape, x.dtype) for x in xs])
  graph = wrapped.graph
  handles = {id(v.handle) for v in variables}
  captured = {id(internal): external for external, internal in graph.captures}
  if any(id(external) not in handles for external, _ in graph.captures):
    raise _Unshareable()
  ops = graph.get_operations()
  backward = set(ops[got['mark']:])

  def _Reads(x):
    return (x.op.type == 'ReadVariableOp' and
            id(captured.get(id(x.op.inputs[0]))) in handles)

  def _Crossing(consumers):
    out, seen = [], set()
    for op in sorted(consumers, key=lambda o: o.name):
      for x in [y for x in op.inputs for y in x.op.outputs]:
        if (x.op not in consumers and id(x) not in seen and
            x.dtype != tf.resource and x.op.type != 'Const' and
            not _Reads(x)):
          seen.add(id(x))
          out.append(x)
    return out

  dxs = [x for x in got['dxs'] if x is not None]
  dys = {id(g) for g in got['dys']}
  read = [x for x in _Crossing(backward) if id(x) not in dys]
  # What the backward reads of the layer's inputs and outputs it is given
  # by the caller (one tensor, not a copy out of the forward); the rest the
  # forward returns after its outputs.
  mine = {id(t): i for i, t in enumerate(got['xs'] + got['ys'])}
  kept = tuple(mine.get(id(x)) for x in read)
  saved = [x for x, k in zip(read, kept) if k is None]
  need_dx = _Ancestors(dxs, backward)
  wcut = _Crossing(_Ancestors([d for d in got['dws'] if d is not None],
                              backward) - need_dx)
  seeds = graph.inputs[:2]
  forward = prune.Prune(wrapped, list(seeds) + got['xs'],
                        got['ys'] + saved)
  dws = [d for d in got['dws'] if d is not None]
  if len(dws) != len(variables):
    raise _Unshareable()  # A variable the layer does not differentiate.
  w_reads = ()  # W's arguments are what B returns (or its own).
  if not dxs:  # No input gradient: W differentiates the whole layer.
    backward_fn = None
    weights = prune.Prune(wrapped, read + got['dys'], dws)
  else:
    # What W reads of B's own arguments (the layer's input, say) the
    # caller hands W, as a traced layer's W reads that very tensor: B
    # returns only what it computes, and a stash keeps no copy.
    args = {id(x): i for i, x in enumerate(read + got['dys'])}
    w_reads = tuple(args.get(id(x)) for x in wcut)
    try:
      weights = prune.Prune(wrapped, wcut, dws)
      backward_fn = prune.Prune(
          wrapped, read + got['dys'],
          dxs + [x for x, i in zip(wcut, w_reads) if i is None])
    except prune.ERRORS:
      # W reads what the cut cannot feed: B computes the weight gradients.
      weights, w_reads = None, ()
      backward_fn = prune.Prune(wrapped, read + got['dys'], dxs + dws)
  for fn in (forward, backward_fn, weights):
    if fn is not None:
      _GRAPHS[tf.compat.as_str(fn.name)] = fn.graph
      # A call marks its graph's variables read: the template's, which the
      # call replaces. The caller marks its own instead (SharedCall).
      fn.graph.variables = []
  _BY_NAME[tf.compat.as_str(forward.name)] = kind = _Kind(
      forward, backward_fn, weights, len(got['ys']),
      tuple(x is not None for x in got['dxs']), tuple(variables),
      Relative(layer, variables), kept, w_reads, got['struct'],
      any(x.consumers() for x in forward.inputs[:2]))
  return kind


def _Ancestors(tensors: Sequence[tf.Tensor], within: set) -> set:
  seen, stack = set(), [t.op for t in tensors]
  while stack:
    op = stack.pop()
    if op in seen or op not in within:
      continue
    seen.add(op)
    stack.extend([i.op for i in op.inputs] + list(op.control_inputs))
  return seen


def _Dense(grad: Any, v: tf.Variable) -> Any:
  if grad is None:
    return None
  grad = tf.convert_to_tensor(grad)
  return grad if grad.shape.is_fully_defined() else tf.ensure_shape(
      grad, v.shape)


def _Call(function: Any, args: Sequence[tf.Tensor], kind: _Kind,
          handles: Sequence[tf.Tensor]) -> list:
  """`function` called on `args` with `handles` (the caller's variables, in
  the order of the kind's) in place of the kind's variables; kept whole
  inside CallsKeptWhole()."""
  index = {id(v.handle): i for i, v in enumerate(kind.variables)}
  captures = [handles[index[id(c)]] for c in function.captured_inputs]
  gradient = (_FORWARD_GRADIENT if function is kind.forward else
              _NO_GRADIENT)
  if _WHOLE.get():
    function = _KeptWhole(function, kind)
  return OverridingGradient(
      lambda: function._call_flat(list(args), captures), gradient)  # pylint: disable=protected-access


def OverridingGradient(call: Callable[[], Any], gradient: str) -> Any:
  """`call()`, a function call, whose op symbolic gradients (tf.gradients)
  differentiate with the gradient registered as `gradient`.
  ConcreteFunction._call_flat gives the op a gradient function of its own
  (TensorFlow differentiating the function's graph), which tf.gradients
  prefers to any override: a run's loop, differentiated so, gave its
  variables no gradient at all. It is dropped here."""
  with tf.compat.v1.get_default_graph().gradient_override_map(
      {'StatefulPartitionedCall': gradient, 'PartitionedCall': gradient}):
    out = call()
  ops = {t.op for t in tf.nest.flatten(out) if isinstance(t, tf.Tensor)}
  for op in ops:
    op._gradient_function = None  # pylint: disable=protected-access
  return out


def _Backward(kind: _Kind, xs: Sequence[Any], ys: Sequence[tf.Tensor],
              saved: Sequence[Any], dys: Sequence[Any],
              handles: Sequence[tf.Tensor]) -> tuple[list, list]:
  """(per input its gradient or None, the variables' gradients in the
  kind's order): B, then W, on one call's inputs, outputs and saved
  tensors."""
  dys = [tf.zeros_like(y) if g is None else g
         for g, y in zip(dys, ys) if y.dtype.is_floating]
  mine, rest = list(xs) + list(ys), iter(saved)
  args = [next(rest) if k is None else mine[k] for k in kind.kept] + dys
  got = (args if kind.backward is None else
         _Call(kind.backward, args, kind, handles))
  num_dx = sum(kind.dx_present)
  dx, rest = iter(got[:num_dx]), got[num_dx:]
  if kind.w_reads:
    made = iter(rest)
    rest = [next(made) if i is None else args[i] for i in kind.w_reads]
  dws = (rest if kind.weights is None else
         _Call(kind.weights, rest, kind, handles))
  # An input gradient has its input's shape, as far as the caller knows it
  # (B's trace may know less: a switch loop's slots need it).
  return [_Like(next(dx), x) if p else None
          for p, x in zip(kind.dx_present, xs)], list(dws)


def _Like(dx: tf.Tensor, x: Any) -> tf.Tensor:
  if isinstance(x, tf.Tensor) and dx.shape.is_compatible_with(x.shape):
    dx.set_shape(x.shape)
  return dx


# Symbolic gradients (tf.gradients, and TensorFlow differentiating a
# function that contains shared calls, as it does for a function called
# eagerly under a tape) find these by the calls' gradient override. A
# forward call's gradient is its layer's B and W; B and W themselves are
# not differentiated again (gradients of gradients through a shared trace
# are not supported: use Off()).
_FORWARD_GRADIENT = 'GpipeSharedTraceForward'
_NO_GRADIENT = 'GpipeSharedTraceBackward'
_BY_NAME: dict = {}  # A forward function's name -> its _Kind.


NO_GRADIENT = _NO_GRADIENT
CallWith = _Call  # (function, args, kind, handles): layers/shared_run.py.
SAVE_MESSAGE = (
    'A SavedModel cannot keep the gradient of a layer trace shared by '
    'several layers (gpipe_tf.layers.shared_trace): save with '
    'tf.saved_model.SaveOptions(experimental_custom_gradients=False), '
    'or trace the saved training function under shared_trace.Off().')


@tf.RegisterGradient(_FORWARD_GRADIENT)
def _ForwardGradient(op: tf.Operation, *grads: Any) -> list:
  if op is None:  # tf.saved_model.save tracing gradients to keep with ops.
    raise SharedTraceSaveError(SAVE_MESSAGE)
  kind = _BY_NAME[op.get_attr('f').name]
  num_args = len(op.inputs) - len(kind.forward.captured_inputs)
  index = {id(v.handle): i for i, v in enumerate(kind.variables)}
  handles = [None] * len(kind.variables)
  order = [index[id(c)] for c in kind.forward.captured_inputs]
  for i, h in zip(order, op.inputs[num_args:]):
    handles[i] = h
  dx, dws = _Backward(kind, op.inputs[2:num_args], op.outputs[:kind.num_y],
                      op.outputs[kind.num_y:], grads[:kind.num_y], handles)
  return [None, None] + dx + [dws[i] for i in order]


@tf.RegisterGradient(_NO_GRADIENT)
def _NoGradient(op: tf.Operation, *grads: Any) -> list:
  del grads
  return [None] * len(op.inputs)


# What SharedCall returns for a layer it does not share: the caller runs
# the layer as written (AutoGraph converting it, in a tf.function).
NOT_SHARED = object()


@tf.autograph.experimental.do_not_convert
def KindOf(layer: Any, fprop: Callable[..., Any], xs: tuple,
           training: bool) -> tuple[_Kind, list] | None:
  """(the kind `layer` called on `xs` shares, traced from this layer if it
  is new; the layer's trainable variables), or None where the layer is
  traced on its own (module docstring)."""
  if (_OFF.get() or not training or not tf.inside_function() or
      tf.distribute.has_strategy() or
      precision.CurrentPolicy() != 'float32' or
      not all(isinstance(x, tf.Tensor) for x in xs)):
    return None
  key = _Key(layer, xs, training)
  if key is None:
    return None
  if key not in _KINDS:
    try:
      _KINDS[key] = _Trace(layer, fprop, xs, [w for _, _, w in key[2]])
      _STATS.traces += 1
    except _Unshareable:
      _KINDS[key] = None
  kind = _KINDS[key]
  if kind is None:
    return None
  variables = list(layer.trainable_variables)
  if (Relative(layer, variables) != kind.names or
      (kind.random and random_seeds.CurrentStepSeed() is None)):
    return None  # Outside a seed scope each draw is fresh.
  return kind, variables


def StepSeed(kind: _Kind) -> tf.Tensor:
  """The step seed a call of `kind` passes (zeros where it draws
  nothing)."""
  step_seed = random_seeds.CurrentStepSeed()
  return tf.zeros([2], tf.int64) if step_seed is None else step_seed


@tf.autograph.experimental.do_not_convert
def SharedCall(layer: Any, fprop: Callable[..., Any], xs: tuple,
               training: bool) -> Any:
  """`fprop(*xs)` (the layer's forward under the precision policy) made
  from its kind's shared trace, or NOT_SHARED where the layer is traced on
  its own (module docstring). Not converted by AutoGraph: what it runs is
  library code and layers that opted in."""
  got = KindOf(layer, fprop, xs, training)
  if got is None:
    return NOT_SHARED
  kind, variables = got
  step_seed = StepSeed(kind)
  _STATS.calls += 1
  seeds = tf.constant(LayerSeeds(layer), tf.int32)
  for v in variables:  # Watched by tapes and by the graph, as a read is.
    resource_variable_ops.variable_accessed(v)
  handles = [v.handle for v in variables]
  with record.stop_recording():
    out = _Call(kind.forward, [step_seed, seeds] + list(xs), kind, handles)
  ys, saved = out[:kind.num_y], out[kind.num_y:]

  def _Grad(*dys):
    dx, dws = _Backward(kind, xs, ys, saved, dys, handles)
    return dx + [None, None] + dws

  record.record_operation('SharedLayer', list(ys),
                          list(xs) + [step_seed, seeds] +
                          [v.handle for v in variables], _Grad)
  return tf.nest.pack_sequence_as(kind.out_struct, ys)
