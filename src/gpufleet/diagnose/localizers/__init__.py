"""The built-in localisers, one module each; :data:`gpufleet.diagnose.localize.LOCALISERS` imports them all."""
