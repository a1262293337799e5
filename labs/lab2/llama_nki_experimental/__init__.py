"""Lab 2's experimental tier: every layer of a decode step (and of the prompt) in one mega-kernel."""
