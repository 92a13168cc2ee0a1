"""Engine features: each one plugs into the event core (``gpufleet.sim.engine``) through the hooks of
:class:`~gpufleet.sim.features.base.Feature`, so that it can be read, and switched off, on its own.

- ``network``: contention between multi-node jobs on shared links (speeds replace the placement penalty);
- ``outages``: node failures and predictor drains injected from a fleet (``gpufleet.sim.failures``);
- ``inference``: the inference pool's load over time, and the usage metric over both pools;
- ``loaning``: Aryl's loaning and reclaiming of inference servers as the load moves;
- ``knapsack``: Aryl's elastic scaling, knapsack rounds over the GPUs left over.
"""
