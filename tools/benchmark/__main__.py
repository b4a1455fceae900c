"""``python -m tools.benchmark``: runs tools/benchmark/main.py."""

from absl import app

from tools.benchmark import main

__all__ = []

if __name__ == '__main__':
  app.run(main.main)
