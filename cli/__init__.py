"""The `fromscratch` console script."""
