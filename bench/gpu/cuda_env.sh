# bench/gpu/cuda_env.sh — sourced by the GPU bench scripts: `cuda_env` puts the CUDA libraries
# where cudarc's dlopen finds them (the toolkit, pip's NVIDIA wheels) and links libnccl.so to
# libnccl.so.2 (cudarc asks for the unversioned name). Needs OUT_DIR and PYTHON set.

cuda_env() {
    local dirs=() d s nccl=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
        [[ -d "${d}" ]] && dirs+=("${d}")
    done
    for s in $("${PYTHON}" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true); do
        for d in "${s}"/nvidia/*/lib; do
            [[ -d "${d}" ]] && dirs+=("${d}")
        done
    done
    nccl="$({ ldconfig -p 2>/dev/null || true; } | awk '/libnccl\.so\.2 /{print $NF; exit}')"
    if [[ -z "${nccl}" ]]; then
        for d in "${dirs[@]}"; do
            if [[ -e "${d}/libnccl.so.2" ]]; then nccl="${d}/libnccl.so.2"; break; fi
        done
    fi
    if [[ -n "${nccl}" ]]; then
        mkdir -p "${OUT_DIR}/.lib"
        ln -sf "${nccl}" "${OUT_DIR}/.lib/libnccl.so"
        dirs+=("$(cd "${OUT_DIR}/.lib" && pwd)")
    fi
    local joined
    joined="$(IFS=:; echo "${dirs[*]}")"
    export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    # Kernels compiled by NVRTC are cached here (a fresh machine compiles them once); outside
    # OUT_DIR, since the device tool brings back only 8 files from $OUT.
    export SINTER_CACHE_DIR="${SINTER_CACHE_DIR:-${TMPDIR:-/tmp}/sinter-kernel-cache}"
}

