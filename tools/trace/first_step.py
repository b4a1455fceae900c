"""Where the time to a deep model's first training step goes: imports, Python tracing, Grappler and the rest of the first call.

Each configuration runs in a fresh process (so nothing is cached between
them), builds L identical Transformer blocks (width --dim, 4 heads, hidden
4 x width, --seq_len tokens, batch --batch_size) either as a plain
`SequentialLayer` under a `tf.GradientTape` or as a `PipeliningLayer` with
only `num_partitions`, `num_micro_batches` and `schedule` set (and the
input shapes its cost estimate needs), takes one SGD step in a
`tf.function`, and reports:

  * imports: importing TensorFlow and gpipe_tf;
  * build: instantiating the layers (variables);
  * tracing: building the step's graph in Python (get_concrete_function);
    with --tracing_parts, a second table splits it into the engine's parts
    (tools/trace/tracing_parts.py);
  * grappler: the graph optimizer's passes during the first call, summed
    from TensorFlow's meta_optimizer log of that process;
  * rest of first call: the first call less Grappler (function
    instantiation, placement, partitioning, executors, and running it);
  * first step: tracing plus the first call;
  * process CPU: the child process's CPU seconds, user and system, from
    start to exit (imports and the next steps included): what a loaded
    machine stretches least, and measured the same way for any tree;
  * next step: the median of the next --next_steps calls (3);
  * traces: the layer kinds traced by layers/shared_trace.py, the layer
    calls, and the runs of identical layers called as one loop
    (layers/shared_run.py).

    python -m tools.trace.first_step                     # L=16,64 plain and 1f1b
    python -m tools.trace.first_step --layers=16,64,128 --schedules=gpipe,1f1b,zb_h1
    python -m tools.trace.first_step --share=on,off      # shared traces A/B
    python -m tools.trace.first_step --share=on,noruns   # runs as loops A/B
    python -m tools.trace.first_step --remat=always,except_last
    python -m tools.trace.first_step --repos=.,/tmp/main # this tree beside another
    python -m tools.trace.first_step --grappler=default,off --next_steps=9
    python -m tools.trace.first_step --tracing_parts     # where tracing goes

Ratios within one run are what count on a shared machine.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import subprocess
import sys
import time

from absl import app
from absl import flags

from tools.trace import tracing_parts

__all__ = ['GrapplerSeconds', 'main']


def _DefineFlags() -> None:
  """Defines the tool's flags: only when it runs as a program, so that tests
  importing several tools define no flag twice."""
  global _L, _SCHEDULES, _K, _M, _V, _SHARE, _REMAT, _LOOPS, _WHOLE, \
      _MIN_FLOPS, _REPOS, _DIM, _SEQ, _BATCH, _CHILD, _GRAPPLER_FLAG, _NEXT, _PARTS  # pylint: disable=global-variable-undefined
  _L = flags.DEFINE_list('layers', ['16', '64'], 'Values of L (blocks).')
  _SCHEDULES = flags.DEFINE_list(
      'schedules', ['plain', '1f1b'],
      "'plain' (SequentialLayer) and pipeline schedules.")
  _K = flags.DEFINE_list('partitions', ['4'], 'Values of K.')
  _M = flags.DEFINE_list('micro_batches', ['8'], 'Values of M.')
  _V = flags.DEFINE_integer('virtual_stages', 2,
                            'V for interleaved_1f1b (other schedules: 1).')
  _SHARE = flags.DEFINE_list(
      'share', ['on'], "'on': shared layer traces, runs of identical layers as loops "
      "(the default); 'noruns': shared traces, each layer called on its own "
      "(shared_run.NoRuns); 'off': every layer traced on its own "
      '(shared_trace.Off).')
  _REMAT = flags.DEFINE_list(
      'remat', ['default'], "PipeliningLayer remat policies ('default': "
      'not set).')
  _LOOPS = flags.DEFINE_bool(
      'layer_loops', False, "Pipelined rows: PipeliningLayer layer_loops "
      "(each cell's runs of blocks as loops, layers/shared_run.py).")
  _WHOLE = flags.DEFINE_bool(
      'whole_layer_calls', False, 'Pipelined rows: PipeliningLayer '
      'whole_layer_calls (layers\' shared traces called whole, not inlined).')
  _MIN_FLOPS = flags.DEFINE_integer(
      'whole_piece_min_flops', None, 'Pipelined rows: PipeliningLayer '
      'whole_piece_min_flops (pieces of at least this many FLOPs a call '
      'that read no stash called whole; e.g. 50000000).')
  _REPOS = flags.DEFINE_list(
      'repos', ['.'], 'Source trees to run the child in (e.g. a worktree of '
      'main beside this one).')
  _GRAPPLER_FLAG = flags.DEFINE_list(
      'grappler', ['default'], "'default': TensorFlow's graph optimizer as "
      "configured; 'off': the child disables it (tf.config.optimizer "
      'disable_meta_optimizer) before it builds the step.')
  _NEXT = flags.DEFINE_integer('next_steps', 3, 'Steps after the first; '
                               'the next step is their median.')
  _DIM = flags.DEFINE_integer('dim', 64, 'Model width.')
  _SEQ = flags.DEFINE_integer('seq_len', 16, 'Tokens per sequence.')
  _BATCH = flags.DEFINE_integer('batch_size', 64, 'Mini-batch (sequences).')
  _PARTS = flags.DEFINE_bool(
      'tracing_parts', False, 'After the table, one of where each row\'s '
      'tracing went (tools/trace/tracing_parts.py; a tree without that '
      'module runs without it).')
  _CHILD = flags.DEFINE_string('child', None, 'Internal: one configuration as '
                               'JSON, run in this process.')


_GRAPPLER = re.compile(r'meta_optimizer\.cc:\d+\] .*time = ([0-9.]+)ms')


def GrapplerSeconds(log: str) -> float:
  """The seconds of every Grappler pass in a meta_optimizer log."""
  return sum(float(t) for t in _GRAPPLER.findall(log)) / 1000


def _Net(config: dict):
  """The model of one configuration: L blocks, plain or pipelined with only
  num_partitions, num_micro_batches, schedule (and its V) set, and remat
  when the configuration names one."""
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from tools.trace import transformer  # pylint: disable=g-import-not-at-top
  blocks = transformer.Blocks(config['layers'], config['dim'])
  if config['schedule'] == 'plain':
    return layers.SequentialLayer.Params().Set(
        name='net', layers=blocks).Instantiate()
  v = config['v'] if config['schedule'] == 'interleaved_1f1b' else 1
  p = PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=config['k'],
      num_micro_batches=config['m'], schedule=config['schedule'],
      num_virtual_stages=v,
      input_shapes=transformer.InputShapes(config['dim'], config['seq_len']))
  if config.get('remat', 'default') != 'default':
    p.Set(remat=config['remat'])
  if config.get('layer_loops'):
    p.Set(layer_loops=True)
  if config.get('whole_layer_calls'):
    p.Set(whole_layer_calls=True)
  if config.get('whole_piece_min_flops') is not None:
    p.Set(whole_piece_min_flops=config['whole_piece_min_flops'])
  return p.Instantiate()


def _Child(config: dict) -> dict:
  """Runs one configuration in this process; returns its timings."""
  start = time.perf_counter()
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(config['k'] if config['schedule'] != 'plain' else 1)
  if config.get('grappler', 'default') == 'off':
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.optimizer.set_experimental_options(
        {'disable_meta_optimizer': True})
  import contextlib  # pylint: disable=g-import-not-at-top
  # Imported here so that 'imports' counts them, not 'build'.
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top,unused-import
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top,unused-import
  from tools.trace import transformer  # pylint: disable=g-import-not-at-top
  try:
    from gpipe_tf.layers import shared_trace  # pylint: disable=g-import-not-at-top
  except ImportError:  # A tree from before shared traces.
    shared_trace = None
  imports = time.perf_counter() - start

  d, t, n = config['dim'], config['seq_len'], config['batch_size']
  start = time.perf_counter()
  net = _Net(config)
  build = time.perf_counter() - start
  _Step = transformer.TrainStep(net, d, t, n, step_seed=True)  # pylint: disable=invalid-name

  off = config['share'] == 'off' and shared_trace is not None
  try:
    from gpipe_tf.layers import shared_run  # pylint: disable=g-import-not-at-top
  except ImportError:  # A tree from before runs of layers.
    shared_run = None
  loops = config['share'] == 'noruns' and shared_run is not None
  with (shared_trace.Off() if off else
        shared_run.NoRuns() if loops else contextlib.nullcontext()):
    start = time.perf_counter()
    with tracing_parts.Parts() as parts:
      _Step.get_concrete_function()
    tracing = time.perf_counter() - start
    start = time.perf_counter()
    _Step().numpy()
    first_call = time.perf_counter() - start
    steps = []
    for _ in range(config.get('next_steps', 3)):
      start = time.perf_counter()
      _Step().numpy()
      steps.append(time.perf_counter() - start)
    next_step = sorted(steps)[len(steps) // 2]
  stats = shared_trace.Stats.Get() if shared_trace else None
  return dict(imports_s=imports, build_s=build, trace_s=tracing,
              tracing_parts_s=parts.seconds,
              first_call_s=first_call, next_step_s=next_step,
              remat=None if config['schedule'] == 'plain' else
              net.params.remat,
              traces=stats.traces if stats else None,
              calls=stats.calls if stats else None,
              runs=getattr(stats, 'runs', None))


def _Run(config: dict, repo: str) -> dict:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0',
             TF_CPP_VMODULE='meta_optimizer=1', PYTHONPATH=os.path.abspath(repo))
  # A tree from before the tools moved into packages has tools/first_step.py.
  tool = ('tools.trace.first_step' if os.path.exists(os.path.join(
      repo, 'tools', 'trace', 'first_step.py')) else 'tools.first_step')
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  proc = subprocess.run(
      [sys.executable, '-m', tool, '--child', json.dumps(config)],
      cwd=repo, env=env, capture_output=True, text=True, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
  if proc.returncode or not lines:
    raise RuntimeError(f'configuration {config} failed in {repo}:\n'
                       f'{proc.stderr[-3000:]}')
  row = json.loads(lines[-1])
  row['grappler_s'] = GrapplerSeconds(proc.stderr)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  row['cpu_s'] = (after.ru_utime - before.ru_utime +
                  after.ru_stime - before.ru_stime)
  return row


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(_Child(json.loads(_CHILD.value))))
    return
  base = dict(dim=_DIM.value, seq_len=_SEQ.value, batch_size=_BATCH.value,
              v=_V.value, next_steps=_NEXT.value)
  if _LOOPS.value:
    base['layer_loops'] = True
  if _WHOLE.value:
    base['whole_layer_calls'] = True
  if _MIN_FLOPS.value is not None:
    base['whole_piece_min_flops'] = _MIN_FLOPS.value
  print(f'{_DIM.value}-wide Transformer blocks, {_SEQ.value} tokens, batch '
        f'{_BATCH.value}; seconds; one fresh process per row')
  print('| tree | L | schedule | K | M | remat | share | optimizer | imports | '
        'build | tracing | grappler | rest of first call | first step | '
        'process CPU | next step | kinds / calls / runs |')
  print('|---' * 17 + '|')
  parts_rows = []
  for layers_, schedule in itertools.product(_L.value, _SCHEDULES.value):
    plain = schedule == 'plain'
    for k, m, remat, share, grappler, repo in itertools.product(
        ['1'] if plain else _K.value, ['1'] if plain else _M.value,
        ['default'] if plain else _REMAT.value, _SHARE.value,
        _GRAPPLER_FLAG.value, _REPOS.value):
      config = dict(base, layers=int(layers_), schedule=schedule, k=int(k),
                    m=int(m), share=share, remat=remat, grappler=grappler)
      r = _Run(config, repo)  # Its remat: the policy the layer ran with.
      first = r['trace_s'] + r['first_call_s']
      # The pipelined rows' layer Params, where set.
      shown = share + ''.join(
          f', {flag}' if base[flag] is True else f', {flag}={base[flag]}'
          for flag in ('layer_loops', 'whole_layer_calls',
                       'whole_piece_min_flops')
          if flag in base and not plain)
      print(f"| {repo} | {layers_} | {schedule} | {k} | {m} | "
            f"{'-' if plain else r.get('remat') or remat} | {shown} | "
            f"{grappler} | "
            f"{r['imports_s']:.1f} | "
            f"{r['build_s']:.1f} | {r['trace_s']:.1f} | "
            f"{r['grappler_s']:.1f} | "
            f"{r['first_call_s'] - r['grappler_s']:.1f} | {first:.1f} | "
            f"{r['cpu_s']:.1f} | {r['next_step_s']:.2f} | "
            f"{r['traces']} / {r['calls']} / {r.get('runs')} |", flush=True)
      parts_rows.append((f'| {repo} | {layers_} | {schedule} | {k} | {m} | '
                         f"{r['trace_s']:.1f} | ", r))
  if _PARTS.value:
    names = list(dict.fromkeys(name for name, _, _ in tracing_parts.PARTS))
    print('\nTracing, seconds: each part less the parts it called '
          '(tools/trace/tracing_parts.py)')
    print('| tree | L | schedule | K | M | tracing | ' + ' | '.join(names) +
          ' | rest |')
    print('|---' * (7 + len(names)) + '|')
    for head, r in parts_rows:
      parts = r.get('tracing_parts_s')
      if parts is None:
        print(head + ' | '.join(['-'] * (len(names) + 1)) + ' |')
        continue
      print(head + ''.join(f'{parts.get(n, 0.0):.1f} | ' for n in names) +
            f"{r['trace_s'] - sum(parts.values()):.1f} |", flush=True)


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
