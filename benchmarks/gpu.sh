#!/usr/bin/env bash
# One CUDA check (<= 5 minutes on one GPU), run whenever a device is lent:
# 1. the cuda-marked tests;
# 2. what one call costs on a CUDA tensor: aten ops, host reads and synchronisations per
#    forward + backward (bench_spectral.py --count), and check_finite=False (a fixed route, no
#    value read) must pass under torch.cuda.set_sync_debug_mode("error");
# 3. the spectral benchmark on the GPU: condreg's R_ill against autodiff through svdvals and
#    against its floor at 64x784, 256x1024, 4096x1024 and a batch (32, 64, 512), PyTorch on cuda
#    (and JAX on its default device).
# Usage: bash benchmarks/gpu.sh [out_dir]   (from the repository root, venv active)
set -euo pipefail
out="${1:-benchmarks/gpu-out}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" | tee "$out/device.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/device.txt" || true
timeout 120 python -m pytest -q -m cuda tests/ 2>&1 | tail -20 | tee "$out/cuda-tests.txt"
timeout 60 python benchmarks/bench_spectral.py --count --device cuda --dtypes float32,float64 \
    --shapes 64x784,1024x512,32x64x512 | tee "$out/counts_cuda.txt"
timeout 120 python benchmarks/bench_spectral.py --frameworks torch --device cuda --repeat 5 \
    --shapes 64x784,256x1024,4096x1024,32x64x512 --markdown --json "$out/bench_torch_cuda.json" \
    | tee "$out/bench_torch_cuda.txt"
JAX_ENABLE_X64=1 timeout 60 python benchmarks/bench_spectral.py --frameworks jax --repeat 3 \
    --shapes 64x784,32x64x512 --json "$out/bench_jax_gpu.json" | tee "$out/bench_jax_gpu.txt" || true
