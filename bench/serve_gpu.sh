#!/usr/bin/env bash
# serve on a lent GPU, in one call: the GPU-marked tests, the whole serve suite with compiled Triton kernels,
# the kernel bench and the end-to-end bench.  Run from the repo root on the device machine:
#   bash bench/serve_gpu.sh tests     # tests only
#   bash bench/serve_gpu.sh bench     # kernels + serve bench on the wide random Llama, fp16
#   bash bench/serve_gpu.sh interp    # only the interpreted Triton twins
#   bash bench/serve_gpu.sh e2e       # only the serve benches (wide, then 7B)
#   bash bench/serve_gpu.sh bench7b   # serve bench on a Llama-2-7B-shaped random model, fp16
#   bash bench/serve_gpu.sh profile   # one decode step per LoRA path, timed (bench/serve_step_profile.py)
# Wheels the image lacks (pydantic, fastapi, ...) may be carried in .whl/; logs go to $OUT (or ./gpu-out).
set -o pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
if [ -f .whl/polars.tar.xz ]; then tar xJf .whl/polars.tar.xz -C /tmp/site || exit 1; fi  # polars, xz-packed to fit
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
case "${1:-all}" in
  tests|all)
    timeout 200 python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests/serve tests/diagnose/test_monitor.py 2>&1 | tee "$out/gpu_tests.log" | tail -15
    # the interpreted twins need TRITON_INTERPRET=1 before triton is imported, so a process of their own
    ;;&
  tests|interp|all)
    TRITON_INTERPRET=1 timeout 100 python3 -m pytest -p no:cacheprovider -q -n 8 -m "not gpu" -k interpreted tests/serve 2>&1 | tee "$out/interp_tests.log" | tail -8
    ;;&
  tests|all)
    timeout 200 python3 -m pytest -p no:cacheprovider -q -n 8 -m "not gpu" -k "not interpreted" tests/serve 2>&1 | tee "$out/serve_tests.log" | tail -15 ;;&
  profile|bench|all)
    timeout 90 python3 bench/serve_step_profile.py --variants "base_only,fused,sgmv+bgmv" --profile "$out/profile.txt" 2>&1 | grep -v -e USDT -e Warn | tee "$out/step.log"
    ;;&
  bench|all)
    timeout 150 python3 bench/serve_kernels.py --json "$out/kernels.json" 2>&1 | tee "$out/kernels.log" | tail -40
    ;;&
  bench|e2e|all)
    timeout 220 python3 bench/serve_bench.py --device cuda --dtype float16 --base wide-llama-random --popularity distinct --repeat 2 --json-out "$out/bench_wide.json" 2>&1 | tee "$out/bench_wide.log" | tail -14
    ;;&
  bench7b|e2e|all)
    timeout 240 python3 bench/serve_bench.py --device cuda --dtype float16 --base llama-7b-random --popularity distinct --requests 32 --repeat 1 --json-out "$out/bench_7b.json" 2>&1 | tee "$out/bench_7b.log" | tail -14 ;;
esac
