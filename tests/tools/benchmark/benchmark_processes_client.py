"""The chief of benchmark_test's processes-mode check: steps and per-device rows with the cells on 2 local workers.

Run as ``python tests/tools/benchmark/benchmark_processes_client.py OUT_DIR`` from the
repository root. Starts 2 local workers (gpipe_tf.runtime.local_workers),
connects to them before any op, and for every configuration of CONFIGS runs
STEPS training steps of SPEC through tools/benchmark/lib.MakeStep with cell
k on worker k, writing their losses to OUT_DIR/losses.json; profiles the
first configuration's steps on the workers (tools/trace/worker_profile.py) into
OUT_DIR/profiles.json; then times the
same configurations with tools/benchmark/processes.Measure (with the
simulator's prediction from the pieces timed on the workers) and writes its
rows to OUT_DIR/rows.json. The test computes the losses again in its own
process on logical devices.
"""

import dataclasses
import json
import os
import sys

from gpipe_tf.runtime import local_workers
from tools.benchmark import lib
from tools.benchmark import processes as processes_lib
from tools.trace import worker_profile

# Big enough that the weights' gradients (2 x 66 KB a device) outweigh the
# boundary tensors (8 KB a micro-batch); a learning rate that moves the loss.
SPEC = lib.ModelSpec(num_blocks=4, dim=128, batch_size=64, learning_rate=0.5)
CONFIGS = (lib.Config(True, 2, 4, 'never', schedule='1f1b', loss_inside=True),
           lib.Config(True, 2, 2, 'always'),
           # Folded: two while loops, the second entered by the first's
           # outputs (what each device's loop variables must not leave).
           lib.Config(True, 2, 4, 'never', schedule='gpipe', loss_inside=True,
                      execution='folded'),
           # schedule='auto': its row predicts the layout the layer chose.
           lib.Config(True, 2, 4, 'never', schedule=lib.AUTO,
                      loss_inside=True))
STEPS = 3


def main(out_dir: str) -> None:
  with local_workers.LocalWorkers(local_workers.Options(num_workers=2)) as w:
    devices = w.Connect()
    losses, steps = [], []
    for cfg in CONFIGS:
      steps.append(lib.MakeStep(SPEC, cfg, devices))
      losses.append([float(steps[-1]().numpy()) for _ in range(STEPS)])
    with open(os.path.join(out_dir, 'losses.json'), 'w') as f:
      json.dump(losses, f)
    # The first configuration's steps (built and run above), profiled on the
    # workers.
    paths = worker_profile.Capture(
        w.cluster.workers, lambda: [steps[0]().numpy() for _ in range(4)],
        os.path.join(out_dir, 'profile'), duration_ms=4000)
    profiles = [dataclasses.asdict(worker_profile.Summarize(
        path, *worker_profile.Read(path))) for path in paths]
    with open(os.path.join(out_dir, 'profiles.json'), 'w') as f:
      json.dump(profiles, f)
    rows = processes_lib.Measure(SPEC, CONFIGS, w, devices, rounds=1,
                                 steps_per_round=2, log=lambda line: None,
                                 predict=True)
    with open(os.path.join(out_dir, 'rows.json'), 'w') as f:
      json.dump(dict(rows=rows, devices=devices, pids=w.pids), f)


if __name__ == '__main__':
  main(sys.argv[1])
