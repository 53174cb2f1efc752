#!/usr/bin/env bash
# bench/gpu_bundle.sh: pack what bench/run_gpu.sh needs on the lent GPU machine into
# bench/gpu_bundle/ddplua-gpu.tar.xz (a folder git ignores: it holds its own .gitignore).
#
#   make -j2 && bench/gpu_bundle.sh
#   then, with the device tool:  run(command="bench/run_gpu.sh parity gemm", carry=["bench/gpu_bundle"])
#
# Why: that machine (see /work/.library/device/KINDS.md) has nvcc, CUDA 13, PyTorch and its
# NVIDIA wheels, but no LuaJIT, OpenBLAS, Gloo, cJSON, libedit or busted, and cannot fetch
# packages. Both machines are x86-64 and the GPU machine's glibc is newer, so the binaries
# built here run there with their shared libraries beside them.
# The bundle holds:
#   build/   libddplua.so, ddplua, libddplua_cuda.so (+ the simulated plug-in), the cdef
#            (debug info stripped)
#   lib/     every shared library those and luajit need, except glibc's, libstdc++,
#            libgcc_s and the CUDA libraries (cuBLAS, cuDNN, NCCL: run_gpu.sh finds the
#            GPU machine's own, in /usr/local/cuda or PyTorch's nvidia-* wheels)
#   bin/     luajit, busted (run by luajit)
#   share/lua/5.1, lib/lua/5.1   busted and its Lua modules
# The whole working tree plus carried paths must stay under 64 MiB; this prints the size.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in build/libddplua.so build/ddplua build/lua/ddplua/cdef.lua; do
  [ -e "$f" ] || { echo "gpu_bundle: $f is missing: run make -j2 first" >&2; exit 1; }
done
[ -e build/libddplua_cuda.so ] || echo "gpu_bundle: warning: no build/libddplua_cuda.so (nvcc missing?): the bundle cannot use a GPU" >&2

dest=bench/gpu_bundle
mkdir -p "$dest"
echo '*' > "$dest/.gitignore"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/lua/ddplua" "$stage/lib" "$stage/bin" "$stage/share/lua" "$stage/lib/lua"

for f in libddplua.so ddplua libddplua_cuda.so libddplua_cuda_sim.so; do
  [ -e "build/$f" ] || continue
  cp "build/$f" "$stage/build/$f"
  strip --strip-debug "$stage/build/$f" 2>/dev/null || true
done
cp build/lua/ddplua/cdef.lua "$stage/build/lua/ddplua/"

luajit_bin=$(readlink -f "$(command -v luajit)")
cp "$luajit_bin" "$stage/bin/luajit"
busted_bin=$(command -v busted) || { echo "gpu_bundle: busted not found (make deps)" >&2; exit 1; }
{ echo '#!/usr/bin/env luajit'; tail -n +2 "$busted_bin"; } > "$stage/bin/busted"
chmod +x "$stage/bin/busted"
cp -rL /usr/share/lua/5.1 "$stage/share/lua/5.1"
cp -rL /usr/lib/x86_64-linux-gnu/lua/5.1 "$stage/lib/lua/5.1"

# shared libraries: the closure of what the binaries and Lua C modules load
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libcublas|libcublasLt|libcudnn|libnccl|libcuda\.so|libcudart|libddplua)'
objs=(build/libddplua.so build/ddplua "$luajit_bin")
[ -e build/libddplua_cuda.so ] && objs+=(build/libddplua_cuda.so)
while IFS= read -r so; do objs+=("$so"); done < <(find "$stage/lib/lua/5.1" -name '*.so')
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$stage/lib/$name"
done

{
  echo "built $(date -u '+%F %H:%M UTC') on $(uname -m), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
} > "$stage/BUNDLE"
tar -cJf "$dest/ddplua-gpu.tar.xz" -C "$stage" .
echo "gpu_bundle: wrote $dest/ddplua-gpu.tar.xz ($(du -h "$dest/ddplua-gpu.tar.xz" | cut -f1)); libraries: $(ls "$stage/lib" | grep -v '^lua$' | tr '\n' ' ')"
tree_mb=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
total=$(( tree_mb + $(stat -c %s "$dest/ddplua-gpu.tar.xz") ))
echo "gpu_bundle: tracked files + bundle = $(( total / 1048576 )) MiB (the device tool takes 64 MiB)"
[ "$total" -lt $(( 60 * 1048576 )) ] || echo "gpu_bundle: WARNING: too large for the device tool" >&2
