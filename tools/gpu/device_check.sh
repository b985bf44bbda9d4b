#!/usr/bin/env bash
# Everything the NCCL issue asks a GPU machine to show, in one command (the
# `device` tool runs one command per call; see ddp/README.md, "CMake build"):
# builds ddp/ with CMake, runs every test with the GPU tests' output in full,
# then the NCCL allreduce benchmark and the GPU DDP step benchmark, each
# with its PyTorch peer, side by side.
#
#   tools/gpu/pack_deps.sh                       # here, once: writes .gpudeps/
#   device run: tools/gpu/device_check.sh        # carry .gpudeps
#
# Results go to $OUT (or ./gpu-results): device.txt, build.log, ctest.log,
# nccl_allreduce.jsonl (lockstep) and torch_nccl_allreduce.jsonl (peer), and
# ddp_cuda.jsonl (DDP step time against local training, lockstep and peer).
# Exit status: the build's or the tests' failure, else the benchmarks'.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
out="${OUT:-${root}/gpu-results}"
mkdir -p "${out}"
python="${PYTHON:-python3}"

{ nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "${python}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"devices", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())' 2>&1
} > "${out}/device.txt"
cat "${out}/device.txt"

# Build and the CPU tests (quiet), then the GPU tests verbosely.
if ! RUN_TESTS=0 tools/gpu/build.sh > "${out}/build.log" 2>&1; then
  tail -n 40 "${out}/build.log"
  echo "device_check: build failed (${out}/build.log)"
  exit 1
fi
tail -n 8 "${out}/build.log"
build_dir="${BUILD_DIR:-build-gpu}"
status=0
(cd "${build_dir}" && ctest --output-on-failure -LE gpu) > "${out}/ctest.log" 2>&1 || status=1
for t in nccl_communicator_test ddp_cuda_test; do
  echo "=== ${t}" >> "${out}/ctest.log"
  timeout 300 "${build_dir}/${t}" >> "${out}/ctest.log" 2>&1 || status=1
done
grep -E "^timeline|^  bucket [0-9]|^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|^\[  FAILED|tests passed|Failure|Skipped" "${out}/ctest.log"
[ "${status}" = 0 ] || { echo "device_check: tests failed (${out}/ctest.log)"; exit 1; }

# Benchmarks: lockstep, then the peer, same sizes (1 KB .. 1 GB).
"${build_dir}/nccl_allreduce_bench" --max-mb "${MAX_MB:-1024}" | tee "${out}/nccl_allreduce.jsonl" || status=1
PYTHONUNBUFFERED=1 "${python}" bench/torch_nccl_allreduce_bench.py --max-mb "${MAX_MB:-1024}" |
  tee "${out}/torch_nccl_allreduce.jsonl" || status=1

# DDP step time on the GPU: lockstep (local and DDP) then the peer (local and
# PyTorch DDP), each model in turn.
peer="${PEER_BENCH:-.gpudeps/peer/torch_ddp_bench.py}"
(
  rc=0
  for model in ${MODELS:-mlp convnet transformer}; do
    "${build_dir}/ddp_cuda_bench" --model "${model}" || rc=1
    if [[ -f "${peer}" ]]; then
      PYTHONUNBUFFERED=1 "${python}" bench/torch_ddp_cuda_bench.py --model "${model}" \
        --peer "${peer}" || rc=1
    else
      echo "device_check: no ${peer}: the PyTorch DDP peer is skipped (run tools/gpu/pack_deps.sh)" >&2
    fi
  done
  exit "${rc}"
) | tee "${out}/ddp_cuda.jsonl" || status=1
exit "${status}"
