"""The program's meaning and the checks against it: the VM (NumPy float64), the lock check of a
bundle against it, the default tolerances and the one formatter of a verdict."""
