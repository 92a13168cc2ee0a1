"""`import gpufleet.spec` stays light: no heavy libraries, no other gpufleet package, no file reads."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light() -> None:
    code = (
        "import sys; import gpufleet.spec as s; "
        "heavy = [m for m in ('numpy', 'polars', 'pyarrow', 'torch', 'plotly') if m in sys.modules]; "
        "own = sorted(m for m in sys.modules if m.startswith('gpufleet.') "
        "and m.split('.')[1] not in ('spec', 'errors')); "
        "print(heavy, own, s.gpu_catalog.cache_info().currsize)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] [] 0"
