"""Runs of identical layers as one loop: depth costs one copy of the block.

shared_trace traces each kind of layer once, but every layer still calls the
kind's functions, and TensorFlow inlines every call before Grappler, so a
step of L blocks still holds L copies of the block's ops for Grappler,
placement and the executors (docs/scale.md). Here consecutive layers of one
kind, each taking exactly what the one before returns (no skip stashed or
popped between them), run as one `tf.while_loop` over the run's layers, as
MaxText's `scan_layers` and Lingvo's `Recurrent` do::

    forward   RF(step seed, seeds[n], xs, handles) -> ys, kept[n]
    backward  RB(kept[n], dys, handles)            -> dxs, wcut[n]
    weights   RW(wcut[n], handles)                  -> dws per layer

Each is one function per (kind, n) whose loop body calls the kind's F, B or
W once, with layer i's variables in place of the kind's: the handles of the
run's variables are stacked and the body takes the i-th. What B reads of
each layer (its inputs, outputs and saved tensors, `_Kind.kept`) RF stacks
along a new first axis; what W reads, RB stacks. A run records itself on
the gradient tape as one operation whose gradient is RB then RW, so a
pipeline cell's pieces are pruned from these calls as from single shared
calls. The numbers are those of the layers called one by one: the same F,
B and W run on the same tensors, in the same order
(tests/layers/shared_run_test.py).

Variables stay each layer's own (names, checkpoints): nothing is stacked
but their handles. A run has at least `MIN_LAYERS` layers; a shorter one,
and any layer shared_trace would not share, is called as before.

A plain model's loops are lowered into its step (Switch, Merge, ...), but
under a device scope (`tf.device`) naming another device than the default
they run as While kernels on it (`_IsDefaultDevice`). A pipeline cell
forms runs only under `LoopsInCells()` (PipeliningLayer `layer_loops`), and
its loops run as While kernels on the cell's device (`_KeepWhole`):
lowered, their loop ops went to the default device.
`NoRuns()` calls every layer on its own (A/B, and the XLA pieces: XLA takes
no stacked resource handles).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from gpipe_tf.layers import shared_trace
from gpipe_tf.layers import skips as skips_lib

# Private TensorFlow APIs, as in shared_trace.py: a run records itself on
# the tape, with recording stopped while it is called, and marks its
# variables read.
from tensorflow.core.framework import attr_value_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

__all__ = ['CellsLoop', 'ListBytes', 'LoopsInCells', 'MIN_LAYERS', 'NoRuns',
           'Run', 'SeparateWeights']

MIN_LAYERS = 2

_NO_RUNS: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_run_off', default=False)


_SEPARATE_W: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_run_separate_w', default=False)


@contextlib.contextmanager
def _Set(var: contextvars.ContextVar) -> Iterator[None]:
  token = var.set(True)
  try:
    yield
  finally:
    var.reset(token)


def NoRuns() -> contextlib.AbstractContextManager:
  """Every shared layer in here is called on its own (no loops)."""
  return _Set(_NO_RUNS)


_IN_CELLS: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_shared_run_in_cells', default=False)


def LoopsInCells() -> contextlib.AbstractContextManager:
  """Pipeline cells traced in here run their runs as loops too
  (`PipeliningLayer` Param `layer_loops`); elsewhere a cell calls each
  layer on its own. A cell's loops run as While kernels, their bodies
  functions of their own on the cell's device (`_KeepWhole`)."""
  return _Set(_IN_CELLS)


def CellsLoop() -> bool:
  """Whether pipeline cells traced now run runs as loops."""
  return _IN_CELLS.get()


def SeparateWeights() -> contextlib.AbstractContextManager:
  """Runs traced in here compute their weight gradients in a loop (RW) of
  their own after the input gradients' (RB), for a schedule that runs W
  apart from B (zero bubble). Elsewhere one loop computes both, each
  layer's W right after its B, so each layer's cut tensors are freed at
  once: 128 blocks stepped 1.37x slower with the cuts of every layer held
  until the W loop."""
  return _Set(_SEPARATE_W)


@dataclasses.dataclass(frozen=True)
class _Run:
  """One (kind, n)'s three loop functions."""
  kind: Any
  n: int
  forward: Any
  backward: Any
  weights: Any | None  # None: RB returns the weight gradients.
  num_kept: int  # RF's outputs after the layers': one list per dtype.
  dws: Any  # The _Stacks of the weight gradients RB or RW returns.
  dws_backwards: bool  # Whether they were pushed from the last layer on.

  def Gradients(self, lists: Sequence[tf.Tensor]) -> list:
    """Per layer, per variable (layer-major): the weight gradients in the
    lists RB or RW returned (read in place, no copy)."""
    nv = len(self.kind.variables)
    got = self.dws.Items(lists, self.dws.specs * self.n)
    rounds = (range(self.n - 1, -1, -1) if self.dws_backwards else
              range(self.n))
    by_layer = {l: got[k * nv:(k + 1) * nv] for k, l in enumerate(rounds)}
    return [t for l in range(self.n) for t in by_layer[l]]


# (a run function's name, an output index) -> the bytes that list holds.
_LIST_BYTES: dict = {}


def ListBytes(x: tf.Tensor) -> tuple[int, list] | None:
  """What a run's list output `x` holds (the activations a kept forward
  stashes for its backward, or W's cuts): (the bytes held by the list
  alone, the run's input, output and output-gradient tensors it holds too,
  to be counted once with the others), or None if `x` is no such list."""
  if x.op.type not in ('PartitionedCall', 'StatefulPartitionedCall'):
    return None
  got = _LIST_BYTES.get((x.op.get_attr('f').name, x.value_index))
  if got is None:
    return None
  size, held = got
  call = x.op  # RF; or RB, whose first input is one of RF's lists.
  forward = (call if call.get_attr('f').name in _BY_NAME else
             call.inputs[0].op)
  if (forward.type not in ('PartitionedCall', 'StatefulPartitionedCall') or
      forward.get_attr('f').name not in _BY_NAME):
    return None
  num_kept = _BY_NAME[forward.get_attr('f').name].num_kept
  tensors = {'in': lambda j: forward.inputs[2 + j],
             'out': lambda j: forward.outputs[j],
             'dy': lambda j: call.inputs[num_kept + j]}
  return size, [tensors[io](j) for io, j in held]


_RUNS: dict = {}  # (the kind's forward name, n, fused, whole) -> _Run
_BY_NAME: dict = {}  # A run forward's name -> its _Run


@tf.autograph.experimental.do_not_convert
def Run(layers: Sequence[Any], fprops: Sequence[Callable[..., Any]],
        xs: tuple, training: bool) -> tuple[tuple, int]:
  """(outputs as a tuple, how many layers of `layers` they are the output
  of) for the run starting at layers[0], or ((), 0) where layers[0] does
  not start one (call it on its own). `fprops[i]` is layer i's forward
  under its precision policy (shared_trace.SharedCall's `fprop`)."""
  if _NO_RUNS.get() or len(layers) < MIN_LAYERS:
    return (), 0
  first = layers[0]
  if skips_lib.Names(first.params, 'stash') or skips_lib.Names(
      first.params, 'pop'):
    return (), 0
  got = shared_trace.KindOf(first, fprops[0], xs, training)
  if got is None or not _Chains(got[0], xs):
    return (), 0
  kind, variables = got
  text = shared_trace.ParamsText(first)
  n = 1
  while (n < len(layers) and type(layers[n]) is type(first) and
         not skips_lib.Names(layers[n].params, 'stash') and
         not skips_lib.Names(layers[n].params, 'pop') and
         shared_trace.ParamsText(layers[n]) == text):
    # Walked once a layer (a module's variables are found by walking it).
    mine = layers[n].trainable_variables
    if shared_trace.Relative(layers[n], mine) != kind.names:
      break
    variables += mine
    n += 1
  if n < MIN_LAYERS:
    return (), 0
  step_seed = shared_trace.StepSeed(kind)
  layers = layers[:n]
  seeds = tf.constant([shared_trace.LayerSeeds(l) for l in layers], tf.int32)
  for v in variables:  # Watched by tapes and by the graph, as a read is.
    resource_variable_ops.variable_accessed(v)
  handles = [v.handle for v in variables]
  nv = len(kind.variables)
  # Per variable of the kind, the run's n handles stacked: the functions
  # take one argument, and return one gradient, per variable, not per layer.
  stacked = [tf.stack(handles[j::nv]) for j in range(nv)]
  # A plain model placed by a device scope on another device than the
  # default runs its loops whole there: on the device its ops get (the
  # stack's, empty where no scope places them).
  device = stacked[0].device
  placed = not _IN_CELLS.get() and bool(device) and not _IsDefaultDevice(
      device)
  run = _RunOf(kind, n, xs, kind.weights is not None and
               not _SEPARATE_W.get(), _IN_CELLS.get() or placed,
               device if placed else None)
  with record.stop_recording():
    out = _Call(run.forward, [step_seed, seeds] + list(xs) + stacked, True)
  ys, kept = out[:len(xs)], out[len(xs):]

  def _Grad(*dys):
    dx, lists = _Backward(run, xs, ys, kept, dys, stacked)
    return dx + [None, None] + run.Gradients(lists)

  record.record_operation('SharedRun', list(ys),
                          list(xs) + [step_seed, seeds] + handles, _Grad)
  shared_trace.CountRun(n)
  for y, x in zip(ys, xs):
    y.set_shape(x.shape)
  return tuple(ys), n


def _IsDefaultDevice(device: str) -> bool:
  """Whether `device` is where TensorFlow places ops that name none (the
  first GPU, else the first CPU, of this process).

  Lowered into a step, a loop's body ops go to that device whatever scope
  the loop was built in (as in a pipeline cell): a SequentialLayer placed
  on a worker process (tools.benchmark --devices=processes) stepped 15x
  slower, its loops' ops on the chief, 1.3 GB sent a step; so a run placed
  elsewhere runs whole (`_KeepWhole`) on its device. On the default device
  lowered loops land where they should, and run 1.16-1.18x faster a step
  than whole (a plain model of 32 blocks under tf.device('/device:CPU:0'),
  in-process A/B)."""
  spec = tf.DeviceSpec.from_string(device)
  default = 'GPU' if tf.config.list_logical_devices('GPU') else 'CPU'
  return ((spec.device_type or '').upper() == default and
          spec.device_index in (None, 0) and
          spec.job in (None, 'localhost') and spec.replica in (None, 0) and
          spec.task in (None, 0))


def _Chains(kind: Any, xs: tuple) -> bool:
  """Whether layers of `kind` chain: each takes what the one before
  returns (same specs), and every input has a gradient B computes."""
  outs = kind.forward.structured_outputs[:kind.num_y]
  return (kind.backward is not None and all(kind.dx_present) and
          kind.num_y == len(xs) and
          all(isinstance(x, tf.Tensor) and x.dtype.is_floating and
              x.shape.is_fully_defined() for x in xs) and
          all(y.dtype == x.dtype and y.shape == x.shape
              for y, x in zip(outs, xs)) and
          shared_trace.IsTupleOf(kind.out_struct, len(xs)))


def _Specs(tensors: Sequence[Any]) -> list:
  return [tf.TensorSpec(t.shape, t.dtype) for t in tensors]


def _RunOf(kind: Any, n: int, xs: tuple, fused: bool, whole: bool,
           device: str | None = None) -> _Run:
  key = (kind.forward.name, n, fused, whole, device)
  if key not in _RUNS:
    _RUNS[key] = run = _Build(kind, n, xs, fused, whole, device)
    _BY_NAME[tf.compat.as_str(run.forward.name)] = run
  return _RUNS[key]


class _Stacks:
  """Tensors pushed and popped in order, kept as one TensorList per dtype
  (a loop variable costs executor ops on every iteration: one list per
  tensor a block keeps made 128 blocks step 1.16x slower than one call per
  layer, against 1.05x now). A push keeps the tensor itself and a pop hands
  it out and drops the list's reference: nothing is copied, and a layer's
  tensors are freed once read."""

  def __init__(self, specs: Sequence[tf.TensorSpec]) -> None:
    self.specs = list(specs)
    self.dtypes = sorted({s.dtype for s in specs}, key=lambda d: d.name)

  def Empty(self) -> list:
    return [tf.raw_ops.EmptyTensorList(element_shape=tf.constant(-1),
                                       max_num_elements=-1, element_dtype=d)
            for d in self.dtypes]

  def Push(self, lists: Sequence[tf.Tensor], items: Sequence[Any]) -> list:
    lists = dict(zip(self.dtypes, lists))
    for t in items:
      lists[t.dtype] = tf.raw_ops.TensorListPushBack(
          input_handle=lists[t.dtype], tensor=t)
    return [lists[d] for d in self.dtypes]

  def Pop(self, lists: Sequence[tf.Tensor], specs: Sequence[tf.TensorSpec]
          ) -> tuple[list, list]:
    """(the lists less the last len(specs) items, those items in the order
    they were pushed)."""
    lists, items = dict(zip(self.dtypes, lists)), []
    for s in reversed(specs):
      lists[s.dtype], t = tf.raw_ops.TensorListPopBack(
          input_handle=lists[s.dtype], element_shape=s.shape,
          element_dtype=s.dtype)
      items.append(t)
    return [lists[d] for d in self.dtypes], items[::-1]

  def Items(self, lists: Sequence[tf.Tensor],
            specs: Sequence[tf.TensorSpec]) -> list:
    """Every item of `lists`, pushed in the order of `specs` (read once the
    pushing is over): each the tensor pushed, not a copy."""
    lists, count, items, shapes = dict(zip(self.dtypes, lists)), {}, [], {}
    for s in specs:
      i = count[s.dtype] = count.get(s.dtype, -1) + 1
      key = tuple(s.shape.as_list())
      if key not in shapes:  # One constant a shape, not one an item.
        shapes[key] = tf.constant(key or [], tf.int32)
      items.append(tf.raw_ops.TensorListGetItem(
          input_handle=lists[s.dtype], index=i, element_shape=shapes[key],
          element_dtype=s.dtype))
    return items

  def Gathered(self, lists: Sequence[tf.Tensor],
               specs: Sequence[tf.TensorSpec], n: int, backwards: bool
               ) -> list:
    """Per spec, its n items stacked, where n rounds of `specs` were pushed
    (in reverse order of the rounds if `backwards`)."""
    lists, count, out = dict(zip(self.dtypes, lists)), {}, []
    for s in specs:
      count[s.dtype] = count.get(s.dtype, 0) + 1
    seen = {}
    for s in specs:
      k = seen[s.dtype] = seen.get(s.dtype, -1) + 1
      rounds = range(n - 1, -1, -1) if backwards else range(n)
      out.append(tf.raw_ops.TensorListGather(
          input_handle=lists[s.dtype],
          indices=[r * count[s.dtype] + k for r in rounds],
          element_shape=s.shape, element_dtype=s.dtype))
    return out


def _Build(kind: Any, n: int, xs: tuple, fused: bool, whole: bool,
           device: str | None = None) -> _Run:
  """Traces RF, RB and RW for `n` layers of `kind` (module docstring).

  What one loop keeps for the next rides in `_Stacks`: RF pushes each
  layer's kept tensors, RB pops them from the last layer back and, when W
  has a loop of its own, pushes W's cuts, which RW pops from the first
  layer on. Fused (no RW), RB calls each layer's W right after its B.
  """
  nx, nv = len(xs), len(kind.variables)
  x_specs = _Specs(xs)
  outs = kind.forward.structured_outputs
  saved = iter(_Specs(outs[kind.num_y:]))
  # Per tensor B reads, its spec: an input's, an output's (the same: the
  # layers chain) or the next saved tensor's.
  kept_specs = [next(saved) if k is None else x_specs[k % nx]
                for k in kind.kept]
  handle_specs = [tf.TensorSpec([n], tf.resource)] * nv
  list_spec = tf.TensorSpec([], tf.variant)
  seeds_spec = tf.TensorSpec([n, kind.forward.inputs[1].shape[0]], tf.int32)
  w_specs = [tf.TensorSpec(v.shape, v.dtype) for v in kind.variables]


  def _Layer(stacked, i):
    return [tf.gather(h, i) for h in stacked]

  def _Loop(body, state):
    out = tf.while_loop(lambda i, *_: i < n, body,
                        (tf.constant(0),) + tuple(state),
                        maximum_iterations=n)[1:]
    if whole:
      _KeepWhole(tf.compat.v1.get_default_graph(), device)
    return out

  dws_stack = _Stacks(w_specs)


  kept_stack = _Stacks(kept_specs)

  def _Forward(step_seed, seeds, *args):
    stacked = args[nx:]

    def _Body(i, xs, lists):
      out = shared_trace.CallWith(
          kind.forward, [step_seed, tf.gather(seeds, i)] + list(xs), kind,
          _Layer(stacked, i))
      ys, rest = list(out[:kind.num_y]), iter(out[kind.num_y:])
      for y, s in zip(ys, x_specs):
        y.set_shape(s.shape)
      mine = list(xs) + ys
      return i + 1, ys, kept_stack.Push(
          lists, [next(rest) if k is None else mine[k] for k in kind.kept])

    ys, lists = _Loop(_Body, (list(args[:nx]), kept_stack.Empty()))
    return list(ys) + list(lists)

  num_dx = nx
  b_outs = _Specs(kind.backward.structured_outputs[num_dx:])
  b_args = kept_specs + x_specs  # What B takes: kept, then dys.
  if kind.weights is None or fused:
    cut_specs = w_specs
  elif kind.w_reads:
    made = iter(b_outs)
    cut_specs = [next(made) if r is None else b_args[r]
                 for r in kind.w_reads]
  else:
    cut_specs = b_outs
  cut_stack = _Stacks(cut_specs)
  num_kept = len(kept_stack.dtypes)

  def _Backward(*args):
    kept = list(args[:num_kept])
    dys = list(args[num_kept:num_kept + nx])
    stacked = args[num_kept + nx:]

    def _Body(i, kept, dys, lists):
      kept, got_args = kept_stack.Pop(kept, kept_specs)
      layer = _Layer(stacked, n - 1 - i)
      got_args += list(dys)
      got = shared_trace.CallWith(kind.backward, got_args, kind, layer)
      dx, rest = list(got[:num_dx]), got[num_dx:]
      if kind.weights is not None and kind.w_reads:
        made = iter(rest)
        rest = [next(made) if r is None else got_args[r]
                for r in kind.w_reads]
      if fused:
        rest = shared_trace.CallWith(kind.weights, rest, kind, layer)
      for d, s in zip(dx, x_specs):
        d.set_shape(s.shape)
      return i + 1, kept, dx, cut_stack.Push(lists, rest)

    _, dx, lists = _Loop(_Body, (kept, dys, cut_stack.Empty()))
    return list(dx) + list(lists)

  def _Weights(*args):
    num_cut = len(cut_stack.dtypes)
    cut, stacked = args[:num_cut], args[num_cut:]

    def _Body(i, cut, lists):
      # The cuts were pushed from the last layer on: the first pops first.
      cut, got = cut_stack.Pop(cut, cut_specs)
      dws = shared_trace.CallWith(kind.weights, got, kind,
                                  _Layer(stacked, i))
      return i + 1, cut, dws_stack.Push(lists, dws)

    _, lists = _Loop(_Body, (list(cut), dws_stack.Empty()))
    return list(lists)

  with tf.device(None):
    forward = tf.compat.v1.wrap_function(
        _Forward, [tf.TensorSpec([2], tf.int64), seeds_spec] + x_specs +
        handle_specs)
    backward = tf.compat.v1.wrap_function(
        _Backward, [list_spec] * num_kept + x_specs + handle_specs)
    weights = (None if kind.weights is None or fused else
               tf.compat.v1.wrap_function(
                   _Weights, [list_spec] * len(cut_stack.dtypes) +
                   handle_specs))
  # What each list output holds (ListBytes).
  kept_from, cut_from = _Sources(kind, nx)
  for k, d in enumerate(kept_stack.dtypes):
    _LIST_BYTES[(tf.compat.as_str(forward.name), nx + k)] = _Held(
        kept_from, kept_specs, x_specs, n, d)
  if not (fused or kind.weights is None):
    if not cut_from:  # W reads B's outputs only.
      cut_from = [('own', ('B', i)) for i in range(len(cut_specs))]
    for k, d in enumerate(cut_stack.dtypes):
      _LIST_BYTES[(tf.compat.as_str(backward.name), nx + k)] = _Held(
          cut_from, cut_specs, x_specs, n, d)
  # The weight gradients' lists: every layer's, as they are made.
  dws_from = [('own', ('W', i)) for i in range(nv)]
  for fn, first in ((backward, nx), (weights, 0)):
    if fn is not None and (fn is weights or fused or kind.weights is None):
      for k, d in enumerate(dws_stack.dtypes):
        _LIST_BYTES[(tf.compat.as_str(fn.name), first + k)] = _Held(
            dws_from, w_specs, x_specs, n, d)
  # What each weighs in a step's plan (periods.Plan: built whole, or folded
  # into loops past the budget): the ops of the n layers it stands for, as
  # when each is called on its own (shared_trace.InlinedSize's count of a
  # call), though it holds one copy (its size as built: its own ops and the
  # body's). Weighed as one copy, a 16-block 1F1B
  # step (K=4, M=8) was built as 12 whole ticks of loops and a repeat
  # instead of one switch loop: its first step took 2.8x as long (Grappler
  # 13.2 s against 3.6 s) and each step after it 1.5x.
  for fn, bodies in ((forward, [kind.forward]),
                     (backward, [kind.backward] +
                      ([kind.weights] if fused else [])),
                     (weights, [kind.weights])):
    if fn is not None:
      body = sum(shared_trace.LiveSize(b.graph) for b in bodies)
      own = len(fn.graph.get_operations())
      shared_trace.Register(fn, n * body, built=own + body)
  return _Run(kind, n, forward, backward, weights, num_kept, dws_stack,
              kind.weights is None or fused)


def _KeepWhole(graph: tf.Graph, device: str | None = None) -> None:
  """Marks the While ops of `graph` to run as While kernels, their body a
  function of their own on the While's device, not lowered into the
  caller's graph (Switch, Merge, Enter ... ops). Lowered, a loop in a
  function placed by its caller (a pipeline piece on device 1) put its
  Enter, Exit and LoopCond ops, and the lists its body pops, on the
  default device: K=2, 1F1B, each backward sent its lists and loop
  condition to device 0 and back on every iteration (partition graphs).
  With `device`, the While ops are placed there: TensorFlow's placer does
  not follow a While's resource inputs, and a plain model's loop, called
  from its step's graph, went to the default device."""
  for op in graph.get_operations():
    if op.type in ('While', 'StatelessWhile'):
      if device:
        op._set_device(device)  # pylint: disable=protected-access
      op._set_attr('_lower_using_switch_merge',  # pylint: disable=protected-access
                   attr_value_pb2.AttrValue(b=False))


def _Sources(kind: Any, nx: int) -> tuple[list, list]:
  """Per tensor B reads and per tensor W reads (the cut), where its buffer
  comes from: ('in' | 'out', j), a state (layer i's input j is layer
  i - 1's output j), ('dy', j), the gradient of output j, or ('own', key),
  a buffer the layer makes. Views (a reshape, say) are followed to the
  buffer they share."""
  fwd = kind.forward.graph
  inputs = {id(fwd.inputs[2 + j]): j for j in range(nx)}
  outputs = {id(shared_trace.Root(y)): j
             for j, y in enumerate(fwd.outputs[:kind.num_y])}
  # An output that is an input passed on (paddings): one buffer all along.
  through = {j for j in range(nx)
             if inputs.get(id(shared_trace.Root(fwd.outputs[j]))) == j}

  def _State(io, j):
    return ('in', j) if j in through else (io, j)

  kept, saved = [], iter(fwd.outputs[kind.num_y:])
  for entry in kind.kept:
    if entry is not None:
      kept.append(_State('in' if entry < nx else 'out', entry % nx))
      continue
    root = shared_trace.Root(next(saved))
    kept.append(_State('in', inputs[id(root)]) if id(root) in inputs else
                _State('out', outputs[id(root)]) if id(root) in outputs else
                ('own', ('F', id(root))))
  args = kept + [('dy', j) for j in range(nx)]  # What B takes.
  if kind.weights is None or not kind.w_reads:
    return kept, []
  bwd = kind.backward.graph
  b_inputs = {id(t): a for a, t in enumerate(bwd.inputs[:len(args)])}
  made, cut = iter(bwd.outputs[nx:]), []
  for r in kind.w_reads:
    if r is not None:
      cut.append(args[r])
      continue
    root = shared_trace.Root(next(made))
    cut.append(args[b_inputs[id(root)]] if id(root) in b_inputs else
               ('own', ('B', id(root))))
  return kept, cut


def _Held(sources: Sequence[tuple], specs: Sequence[tf.TensorSpec],
          x_specs: Sequence[tf.TensorSpec], n: int, dtype: tf.DType
          ) -> tuple[int, tuple]:
  """What a list of `dtype` holds of n layers' tensors from `sources`
  (_Sources), each buffer once: (the bytes of the buffers only the list
  holds, the run's tensors it holds too as ('in' | 'out' | 'dy', j)). A
  state (layer i's output, layer i + 1's input) is held once whichever
  way B reads it; of n states, one is the run's input (or output), and of
  n output gradients, the last is the run's."""
  own, chained = {}, set()
  for source, spec in zip(sources, specs):
    if spec.dtype != dtype:
      continue
    if source[0] == 'own':
      own[source[1]] = spec.shape.num_elements() * dtype.size
    else:
      chained.add(source)
  size = n * sum(own.values())
  for j in {(io == 'dy', j) for io, j in chained}:
    size += (n - 1) * x_specs[j[1]].shape.num_elements() * dtype.size
  return size, tuple(sorted(chained))


def _Call(function: Any, args: Sequence[tf.Tensor], forward: bool) -> list:
  gradient = _RUN_GRADIENT if forward else shared_trace.NO_GRADIENT
  return shared_trace.OverridingGradient(
      lambda: function._call_flat(list(args), []), gradient)  # pylint: disable=protected-access


def _Backward(run: _Run, xs: Sequence[Any], ys: Sequence[tf.Tensor],
              kept: Sequence[tf.Tensor], dys: Sequence[Any],
              handles: Sequence[tf.Tensor]) -> tuple[list, list]:
  """(the inputs' gradients, the lists of weight gradients): RB, then RW.
  `handles`: per variable of the kind, the run's handles stacked."""
  dys = [tf.zeros_like(y) if g is None else g for g, y in zip(dys, ys)]
  got = _Call(run.backward, list(kept) + dys + list(handles), False)
  dx, rest = got[:len(xs)], got[len(xs):]
  dws = (rest if run.weights is None else
         _Call(run.weights, list(rest) + list(handles), False))
  for d, x in zip(dx, xs):
    d.set_shape(x.shape)
  return list(dx), list(dws)


# A run's forward found by symbolic gradients (tf.gradients, TensorFlow
# differentiating a function that holds runs): its gradient is RB then RW.
_RUN_GRADIENT = 'GpipeSharedRunForward'


@tf.RegisterGradient(_RUN_GRADIENT)
def _RunGradient(op: tf.Operation, *grads: Any) -> list:
  if op is None:
    raise shared_trace.SharedTraceSaveError(shared_trace.SAVE_MESSAGE)
  run = _BY_NAME[op.get_attr('f').name]
  nx = len(op.outputs) - run.num_kept
  xs = op.inputs[2:2 + nx]
  dx, lists = _Backward(run, xs, op.outputs[:nx], op.outputs[nx:],
                        grads[:nx], op.inputs[2 + nx:])
  dws = run.dws.Gathered(lists, run.dws.specs, run.n, run.dws_backwards)
  # The call's inputs: seeds, xs, the stacked handles (tf.gradients takes
  # each variable's from the stack's gradient).
  return [None, None] + dx + dws
