#!/usr/bin/env bash
# The CUDA path in one run on a machine with an NVIDIA GPU: tests/test_cuda.py
# (GPU results equal to the CPU's; a GPU-trained embedder and router served on a
# machine with no GPU), the speed figures on the GPU, then where the time goes
# (benchmarks/gpu_profile.py). Logs, the profile and docs/performance-cuda.md's
# text go to OUTDIR.
#
#     bash benchmarks/gpu_check.sh OUTDIR
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv |
    tee "$out/gpu.txt"
python3 -c "import torch, skorch, sklearn; print('torch', torch.__version__,
    'skorch', skorch.__version__, 'scikit-learn', sklearn.__version__)" |
    tee -a "$out/gpu.txt"
timeout 150 python3 -m pytest -q -s -n 0 -p no:cacheprovider tests/test_cuda.py \
    >"$out/test_cuda.log" 2>&1
echo "tests/test_cuda.py exit $?"; tail -n 25 "$out/test_cuda.log"
timeout 330 python3 benchmarks/speed.py --devices cuda --scale-device cuda \
    --skip-encoding --out "$out/performance-cuda.md" >"$out/speed.log" 2>&1
echo "speed.py exit $?"; tail -n 5 "$out/speed.log"
timeout 150 python3 benchmarks/gpu_profile.py --out "$out/gpu-profile.txt" \
    >"$out/profile.log" 2>&1
echo "gpu_profile.py exit $?"; grep -E "^\|" "$out/profile.log"
{
    echo
    echo "## The CUDA path (tests/test_cuda.py, as printed by its tests)"
    echo
    grep -E "^\.*(largest|routing|bfloat16|float16)" "$out/test_cuda.log" |
        sed -E 's/^\.*/- /'
    tail -n 1 "$out/test_cuda.log" | sed 's/^/- tests: /'
} >>"$out/performance-cuda.md"
cat "$out/performance-cuda.md"
