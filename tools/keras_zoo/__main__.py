"""``python -m tools.keras_zoo``: runs tools/keras_zoo/main.py."""

from absl import app

from tools.keras_zoo import main

__all__ = []

if __name__ == '__main__':
  app.run(main.main)
