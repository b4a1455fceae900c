"""pytest set-up: split the CPU into logical devices before any test runs an op."""

import test_utils

test_utils.SetUpDevices()
