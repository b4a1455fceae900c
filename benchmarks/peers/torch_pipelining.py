"""Times torch.distributed.pipelining on tools.benchmark's models: one process per stage, one thread each, gloo.

The peer of ``python -m tools.benchmark --devices=processes``: K processes on
this host, process k pinned to core k (round-robin past the cores) with one
intra-op and one inter-op thread, talking over gloo on localhost, each
running its stages of PyTorch's pipeline schedules. The models are the
benchmark's (tools/benchmark/lib.py):

  fc           32 x (Linear 256 -> 256, ReLU), batch 2048
  transformer  8 x pre-layer-norm encoder blocks (d=256, 4 heads, hidden
               1024, ReLU, no dropout), 32 tokens, batch 64 sequences

and so is the step: forward, backward and one SGD update (lr 1e-4) of the
mean squared output, computed per micro-batch on the last stage. A
schedule's stages are contiguous, equal blocks; schedules with V stages per
process (interleaved, ZBV, DualPipeV: V=2) place them as PyTorch expects
(looped for interleaved, V-shaped for ZBV and DualPipeV).

Needs PyTorch (``pip install torch``); PyTorch is not a dependency of
gpipe_tf. From the repository root::

  python benchmarks/peers/torch_pipelining.py --model=fc --micro_batches=8
  python benchmarks/peers/torch_pipelining.py --model=transformer \\
      --micro_batches=8 --schedules=gpipe,1f1b,interleaved_1f1b,zbv

Prints one markdown row per schedule: examples/sec over the median step of
--steps timed steps (after --warmup), the range over those steps, and each
process's CPU time per step (all its threads; pinned to one core, at most
the step time).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed import pipelining

# name: (PyTorch schedule class, stages per process, V-shaped placement).
SCHEDULES = {
    'gpipe': ('ScheduleGPipe', 1, False),
    '1f1b': ('Schedule1F1B', 1, False),
    'interleaved_1f1b': ('ScheduleInterleaved1F1B', 2, False),
    'interleaved_zb': ('ScheduleInterleavedZeroBubble', 2, False),
    'zbv': ('ScheduleZBVZeroBubble', 2, True),
    'dualpipe_v': ('ScheduleDualPipeV', 2, True),
}
MODELS = {
    'fc': dict(num_blocks=32, dim=256, batch_size=2048),
    'transformer': dict(num_blocks=8, dim=256, batch_size=64, seq_len=32),
}
LEARNING_RATE = 1e-4


def Blocks(model: str) -> list[nn.Module]:
  """The benchmark model's identical blocks (seeded: every run the same)."""
  torch.manual_seed(0)
  cfg = MODELS[model]
  d = cfg['dim']
  if model == 'fc':
    return [nn.Sequential(nn.Linear(d, d), nn.ReLU())
            for _ in range(cfg['num_blocks'])]
  return [nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0,
                                     activation='relu', batch_first=True,
                                     norm_first=True)
          for _ in range(cfg['num_blocks'])]


def Inputs(model: str) -> torch.Tensor:
  cfg = MODELS[model]
  shape = [cfg['batch_size'], cfg['dim']]
  if model == 'transformer':
    shape.insert(1, cfg['seq_len'])
  return torch.randn(shape, generator=torch.Generator().manual_seed(1))


def StageRank(stage: int, world: int, v_shaped: bool) -> int:
  """The process of `stage`: looped (s mod K) or V-shaped (0..K-1, K-1..0)."""
  if v_shaped:
    return stage if stage < world else 2 * world - 1 - stage
  return stage % world


def _Loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
  del target
  return output.square().mean()


def _Worker(rank: int, world: int, port: int, args, results) -> None:
  cores = sorted(os.sched_getaffinity(0))
  os.sched_setaffinity(0, {cores[rank % len(cores)]})
  torch.set_num_threads(1)
  torch.set_num_interop_threads(1)
  dist.init_process_group('gloo', rank=rank, world_size=world,
                          init_method=f'tcp://localhost:{port}')
  device = torch.device('cpu')
  x = Inputs(args.model)
  out = {}
  for name in args.schedules:
    class_name, per_rank, v_shaped = SCHEDULES[name]
    schedule_class = getattr(pipelining, class_name, None)
    if schedule_class is None:
      out[name] = 'not in this PyTorch'
      continue
    blocks = Blocks(args.model)
    num_stages = world * per_rank
    per_stage = len(blocks) // num_stages
    mine = [s for s in range(num_stages)
            if StageRank(s, world, v_shaped) == rank]
    modules = [nn.Sequential(*blocks[s * per_stage:(s + 1) * per_stage])
               for s in mine]
    stages = [pipelining.PipelineStage(m, s, num_stages, device)
              for m, s in zip(modules, mine)]
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=LEARNING_RATE)
    schedule = schedule_class(stages if per_rank > 1 else stages[0],
                              n_microbatches=args.micro_batches,
                              loss_fn=_Loss)
    target = torch.zeros(x.shape[0])
    first, last = 0 in mine, num_stages - 1 in mine

    def _Step():
      optimizer.zero_grad()
      kwargs = {}
      if last:
        kwargs.update(target=target, losses=[])
      if first:
        schedule.step(x, **kwargs)
      else:
        schedule.step(**kwargs)
      optimizer.step()

    times, cpu = [], 0.0
    for i in range(args.warmup + args.steps):
      dist.barrier()
      start, start_cpu = time.perf_counter(), time.process_time()
      _Step()
      dist.barrier()
      if i >= args.warmup:
        times.append(time.perf_counter() - start)
        cpu += time.process_time() - start_cpu
    out[name] = dict(seconds=times, cpu_seconds_per_step=cpu / args.steps)
  results.put((rank, out))
  dist.destroy_process_group()


def _FreePort() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', choices=sorted(MODELS), default='fc')
  parser.add_argument('--processes', type=int, default=2,
                      help='K: processes (one per device).')
  parser.add_argument('--micro_batches', type=int, default=8)
  parser.add_argument('--schedules', default='gpipe,1f1b,interleaved_1f1b,'
                      'interleaved_zb,zbv,dualpipe_v',
                      help=f'Comma-separated, of {", ".join(SCHEDULES)}.')
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--json', help='Also write the step times here.')
  args = parser.parse_args(argv)
  args.schedules = [s for s in args.schedules.split(',') if s]
  unknown = [s for s in args.schedules if s not in SCHEDULES]
  if unknown:
    parser.error(f'unknown schedules {unknown}; use {", ".join(SCHEDULES)}.')
  ctx = mp.get_context('spawn')
  results = ctx.SimpleQueue()
  mp.start_processes(_Worker, args=(args.processes, _FreePort(), args,
                                    results),
                     nprocs=args.processes, start_method='spawn')
  by_rank = dict(results.get() for _ in range(args.processes))
  out = by_rank[0]
  batch = MODELS[args.model]['batch_size']
  print(f'torch {torch.__version__}, {args.model}, K={args.processes} '
        f'processes, M={args.micro_batches}, gloo, 1 thread each, '
        f'{len(os.sched_getaffinity(0))} cores, load average '
        f'{os.getloadavg()[0]:.1f}')
  print('| schedule | PyTorch class | examples/sec | range over steps | '
        'step ms | busy ms (CPU time per step, each process) |')
  print('|---|---|---|---|---|---|')
  for name in args.schedules:
    if isinstance(out[name], str):
      print(f'| {name} | {SCHEDULES[name][0]} | {out[name]} | | | |')
      continue
    times = out[name]['seconds']
    busy = ' / '.join(f"{1000 * by_rank[r][name]['cpu_seconds_per_step']:.0f}"
                      for r in range(args.processes))
    print(f'| {name} | {SCHEDULES[name][0]} | '
          f'{batch / statistics.median(times):.1f} | '
          f'{batch / max(times):.1f}-{batch / min(times):.1f} | '
          f'{1000 * statistics.median(times):.0f} | {busy} |')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(dict(model=args.model, processes=args.processes,
                     micro_batches=args.micro_batches, batch_size=batch,
                     by_rank=by_rank), f, indent=1)


if __name__ == '__main__':
  main(sys.argv[1:])
