"""Applications on top of the stack: the `nativelab` command line."""
