#!/usr/bin/env bash
# Container entrypoint, SageMaker contract: `docker run IMAGE serve` starts the server on 8080.
#   serve [ARGS]    lmi-trt serve on 0.0.0.0:8080 with /opt/ml/model (restarts while it exits 77)
#   compile ARGS    ahead-of-time compile (lmi-trt compile), e.g. compile --output s3://bucket/engines
#   partition ARGS  DJL's name for the same ahead-of-time step
#   anything else   run as a command
# TGI/SageMaker variable aliases (SM_NUM_GPUS, MAX_BATCH_SIZE, HF_MODEL_QUANTIZE, ...) are mapped
# by lmi-trt's config stage itself, so that `lmi-trt serve` outside a container behaves the same.
set -uo pipefail

LMI_TRT=${LMI_TRT:-lmi-trt}
CUDA_COMPAT_DIR=${CUDA_COMPAT_DIR:-/usr/local/cuda/compat}
NVIDIA_VERSION_FILE=${NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}

# version_le A B: true when A <= B as dotted versions.
version_le() { [ "$1" = "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" ]; }

# The CUDA forward-compatibility libraries help only on a host driver older than the image's
# CUDA; on a newer driver they break it, so use them only when the host driver is <= their max.
setup_cuda_compat() {
  local compat_lib="$CUDA_COMPAT_DIR/libcuda.so.1" max driver
  if [ ! -e "$compat_lib" ]; then
    echo "cuda-compat: no compat package at $CUDA_COMPAT_DIR; using the host driver"
    return
  fi
  max=$(readlink "$compat_lib" | sed -n 's/^libcuda\.so\.\([0-9.]*\)$/\1/p')
  driver=$(sed -n 's/^NVRM.*Kernel Module[^0-9]*\([0-9.]*\).*$/\1/p' "$NVIDIA_VERSION_FILE" 2>/dev/null || true)
  if [ -z "$driver" ] || [ -z "$max" ]; then
    echo "cuda-compat: host driver version '${driver}' or compat version '${max}' unknown; using the host driver"
  elif version_le "$driver" "$max"; then
    echo "cuda-compat: host driver $driver <= $max; adding $CUDA_COMPAT_DIR to LD_LIBRARY_PATH"
    export LD_LIBRARY_PATH="$CUDA_COMPAT_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "cuda-compat: host driver $driver is newer than $max; not using the compat libraries"
  fi
}

setup_cuda_compat

cmd=${1:-serve}
[ $# -gt 0 ] && shift
case "$cmd" in
  serve)
    # lmi-trt runs as a child so that the restart loop can live here; docker stop / SageMaker's
    # SIGTERM is forwarded to it, so it drains in-flight requests instead of being killed.
    child="" stopping=0
    trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
    while true; do
      "$LMI_TRT" serve --host "${LMI_HOST:-0.0.0.0}" --port "${SAGEMAKER_BIND_TO_PORT:-8080}" "$@" &
      child=$!
      wait "$child"
      code=$?
      # A trapped signal interrupts `wait`; keep waiting for the child's own exit status.
      while kill -0 "$child" 2>/dev/null; do
        wait "$child"
        code=$?
      done
      # 77 asks for a restart (DJL's convention), anything else is final so the platform sees it.
      if [ "$code" -ne 77 ] || [ "$stopping" -eq 1 ]; then
        exit "$code"
      fi
      echo "lmi-trt asked for a restart (exit 77)"
    done
    ;;
  compile|partition)
    exec "$LMI_TRT" compile "$@"
    ;;
  *)
    exec "$cmd" "$@"
    ;;
esac
