"""Models that run on the device (Lab 2)."""
