#!/usr/bin/env bash
# The declarations in this directory against the real CUDA runtime and NCCL
# headers, where a CUDA toolkit with NCCL is installed (CUDA_HOME, default
# /usr/local/cuda; skipped, saying so, without one): every function declared
# here has the same type there (the config struct's versioned tag aside), and
# every constant the same value. A program compiled against each set of
# headers prints them; the two outputs must match.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Run by Bazel, the script is third_party/cuda_api_declarations_test.
[[ -f "${here}/nccl.h" ]] || here="${here}/cuda_api"
cuda="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -f "${cuda}/include/nccl.h" || ! -f "${cuda}/include/cuda_runtime_api.h" ]]; then
  echo "SKIP: no CUDA toolkit with NCCL in ${cuda} to compare against"
  exit 0
fi
cxx="${CXX:-g++}"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# Every function and object-like constant these headers declare.
funcs=$(grep -ohE '^[a-zA-Z_][a-zA-Z_0-9 *]* \*?(cuda|nccl)[A-Za-z0-9_]+\(' "${here}"/*.h |
  grep -oE '(cuda|nccl)[A-Za-z0-9_]+\($' | tr -d '(' | sort -u)
consts=$( (grep -ohE '^  (cuda|nccl)[A-Za-z0-9_]+ = ' "${here}"/*.h | awk '{print $1}'
  grep -ohE '^#define (cuda|NCCL_)[A-Za-z0-9_]+ ' "${here}"/*.h | awk '{print $2}') |
  grep -vE '^(NCCL_CONFIG_INITIALIZER|NCCL_CONFIG_UNDEF_PTR|NCCL_MAJOR|NCCL_MINOR|NCCL_PATCH|NCCL_VERSION_CODE)$' | sort -u)
[[ $(wc -w <<<"${funcs}") -ge 20 && $(wc -w <<<"${consts}") -ge 30 ]] ||
  { echo "FAIL: found only $(wc -w <<<"${funcs}") functions and $(wc -w <<<"${consts}") constants"; exit 1; }

{
  echo '#include <cuda_runtime_api.h>'
  echo '#include <nccl.h>'
  echo "#include <cstddef>"
  echo "#include <cstdio>"
  echo 'template <class T> const char* TypeOf() { return __PRETTY_FUNCTION__; }'
  echo 'int main() {'
  for f in ${funcs}; do echo "  std::printf(\"${f} %s\\n\", TypeOf<decltype(&${f})>());"; done
  for c in ${consts}; do echo "  std::printf(\"${c} %lld\\n\", static_cast<long long>(${c}));"; done
  echo '  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;'
  echo '  config.blocking = 0;'
  echo '  std::printf("ncclUniqueId %zu bytes, blocking at %zu\\n", sizeof(ncclUniqueId),'
  echo '              offsetof(ncclConfig_t, blocking));'
  echo '}'
} > "${work}/probe.cc"
"${cxx}" -std=c++17 -I"${cuda}/include" "${work}/probe.cc" -o "${work}/real"
"${cxx}" -std=c++17 -I"${here}" "${work}/probe.cc" -o "${work}/declared"
# The config struct's tag names the NCCL version (ncclConfig_v22800).
"${work}/real" | sed -E 's/ncclConfig_v[0-9]+/ncclConfig_vN/' > "${work}/real.txt"
"${work}/declared" | sed -E 's/ncclConfig_v[0-9]+/ncclConfig_vN/' > "${work}/declared.txt"
if ! diff -u "${work}/real.txt" "${work}/declared.txt"; then
  echo "FAIL: third_party/cuda_api differs from ${cuda}/include (- real, + declared here)"
  exit 1
fi
echo "PASS: $(wc -w <<<"${funcs}") functions and $(wc -w <<<"${consts}") constants as in ${cuda}/include"
