"""Machine-translation experiments."""
