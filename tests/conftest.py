"""Settings for the whole suite."""

import os

# pytest-xdist's workers set COLUMNS=80, and the command line honours COLUMNS for piped output; the CLI tests
# read tables as a pipe would without it (160 columns), whichever way the suite is run.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
