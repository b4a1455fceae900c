"""Model builders: functions returning the list of layer Params of a network."""

__all__ = []
