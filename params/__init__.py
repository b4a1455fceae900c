"""Experiments: params/<task>/<dataset>.py modules of registered experiment classes."""
