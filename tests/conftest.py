"""pytest set-up: split the CPU into logical devices before any test runs an op; slowest modules first."""

import os

import test_utils

test_utils.SetUpDevices()

# The modules whose tests take longest (seconds summed over a full run), run
# first: under `pytest -n 2 --dist loadgroup` the tests left at the end are
# then short ones, so both workers finish together rather than one waiting on
# a minute-long test started last. Only the order changes; a module missing
# here keeps its place after these.
_SLOWEST_FIRST = (
    'runtime/pipeline_cluster_replicas_test.py',
    'runtime/pipeline_cluster_test.py',
    'pipeline/schedule_transparency_test.py',
    'pipeline/support_test.py',
    'tools/benchmark_test.py',
    'runtime/multi_worker_test.py',
    'tools/fit_digits_test.py',
    'runtime/distribute_test.py',
    'integration/trainer_test.py',
    'pipeline/keras_import_test.py',
    'pipeline/interpreter_test.py',
    'integration/image_experiments_test.py',
    'tools/trace_cost_test.py',
    'trainer_errors_test.py',
    'runtime/local_workers_test.py',
)


def pytest_collection_modifyitems(config, items):
  del config  # Unused.
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  rank = {os.path.join(tests_dir, path): i
          for i, path in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # Stable.
