"""The placement layer: where a job the order chose starts (one registered file per placement).

See :mod:`gpufleet.sched.placement.base` for the interface and the registry; every module of this package is
imported on the first lookup, so a new placement is one new file here.
"""
