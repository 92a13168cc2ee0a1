"""``python -m gpufleet.cli``: the same as the ``gpufleet`` command."""

from gpufleet.cli import main

main()
