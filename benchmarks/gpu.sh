#!/usr/bin/env bash
# One CUDA check (<= 5 minutes on one GPU): the cuda-marked tests, then the spectral benchmark
# on the GPU (PyTorch on cuda, JAX on its default device) at a subset of shapes.
# Usage: bash benchmarks/gpu.sh [out_dir]   (from the repository root, venv active)
set -euo pipefail
out="${1:-benchmarks/gpu-out}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" | tee "$out/device.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/device.txt" || true
timeout 150 python -m pytest -q -m cuda tests/ 2>&1 | tail -20 | tee "$out/cuda-tests.txt"
timeout 120 python benchmarks/bench_spectral.py --frameworks torch --device cuda --repeat 5 \
    --shapes 64x784,64x2048,256x1024,1024x512,4096x1024 --json "$out/bench_torch_cuda.json" \
    | tee "$out/bench_torch_cuda.txt"
JAX_ENABLE_X64=1 timeout 60 python benchmarks/bench_spectral.py --frameworks jax --repeat 3 \
    --shapes 64x784,1024x512 --json "$out/bench_jax_gpu.json" | tee "$out/bench_jax_gpu.txt" || true
