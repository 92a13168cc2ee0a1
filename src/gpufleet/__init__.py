"""gpufleet: a toolkit for people who run large GPU clusters for deep learning.

Importing the package is cheap on purpose: heavy dependencies load inside the capability that needs them.
"""

__version__ = "0.1.0"
