#!/usr/bin/env bash
# One release leg of CI: `ci/leg.sh 1.0.0` installs lmi-trt under the Python pins of TensorRT-LLM 1.0.0's
# release image (ci/pins/trtllm-1.0.0.txt) in a fresh venv, checks that pip replaced none of them, and runs
# the tests that apply to that release (ci/release-tests.txt) with the fake tensorrt_llm impersonating it.
# Run from anywhere; .ci/run calls it once per release. Exit status: non-zero if any step fails.
set -euo pipefail
release="${1:?usage: ci/leg.sh RELEASE (one of: $(cd "$(dirname "$0")/pins" && ls | sed 's/^trtllm-//; s/\.txt$//' | tr '\n' ' '))}"
cd "$(dirname "$0")/.."
pins="ci/pins/trtllm-$release.txt"
[ -f "$pins" ] || { echo "no pins file $pins" >&2; exit 2; }
export HF_HUB_OFFLINE=1 PIP_PROGRESS_BAR=off PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Tiny test models built by this leg's transformers (a newer one writes files an older one cannot read).
export LMI_TEST_MODEL_CACHE="$PWD/.ci-venvs/models-$release"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$PWD/.ci-cache/pip}"  # shared by every leg: each wheel is fetched or built once
out="${LMI_CI_OUT:-$PWD/.ci-out}"
mkdir -p "$out"
venv=".ci-venvs/trtllm-$release"
t0=$SECONDS

# torch: the images have NGC CUDA builds that PyPI does not carry, and PyPI's own Linux wheels of those
# versions are CUDA builds of ~3 GB each with their nvidia-* libraries. Every leg takes the CPU build
# this machine's pip finds locally instead (README "Supported TensorRT-LLM releases").
ci_torch="torch==2.13.0"
# Constraints for the venv: the pins less torch.
constraints="$out/constraints-$release.txt"
grep -v -E '^torch(==|>|<|~| |$)' "$pins" > "$constraints"

# 1. The image's own Python (3.10 for 0.12, 3.12 after), where this machine has it: the code byte-compiles
#    there. (A dry-run resolution there too cost ~3-5 min a leg on this machine: left out to keep .ci/run
#    inside its time limit; the venv below resolves on this machine's Python.)
image_py="$(sed -n 's/^# ci: python=//p' "$pins")"
# pyenv's shims answer for every version's names; only a real interpreter counts.
py_bin=""
for candidate in "$(command -v "python$image_py" || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$image_py".*/bin/"python$image_py"; do
  if [ -x "$candidate" ] && "$candidate" -c 'import sys' 2>/dev/null; then py_bin="$candidate"; fi
done
if [ -n "$py_bin" ]; then
  echo "== $release: byte-compiling under $("$py_bin" -V) (the image's Python)"
  "$py_bin" -m compileall -q lmi_trt tests >/dev/null
else
  echo "== $release: no python$image_py on this machine: only $(python3 -V) checks this leg"
fi

# 2. The test venv: the project under the pins (the resolution check: pip fails if it cannot stay inside them),
#    with the test tools the release's tests need (.[test-core]; the default run has the whole .[test]).
echo "== $release: installing under $pins (torch: $ci_torch)"
rm -rf "$venv"
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install -q "$ci_torch" mpich -c "$constraints"
# The images' mpi4py 3.1.5 has no wheel: it builds from source (as install_mpi4py.sh does), here against
# PyPI mpich's mpicc, with a setuptools of its day (today's dropped the distutils API its setup.py uses).
# Not from pip's wheel cache: a wheel built in another venv links that venv's libmpi, and fails to load once it
# is gone (a PIP_CACHE_DIR kept between runs).
pip install -q "setuptools<70" wheel
# Unoptimised (CFLAGS=-O0, after Python's own -O flags, so it wins): the tests use mpi4py's API, not its speed, and
# its one large C file compiles in ~11 s instead of ~50 s here.
MPICC="$VIRTUAL_ENV/bin/mpicc" CFLAGS=-O0 pip install -q --no-cache-dir --no-build-isolation -c "$constraints" mpi4py
# The editable install writes the project's build files (lmi_trt.egg-info) into the tree: under the lock .ci/run's
# default install takes too, since that install runs beside the legs.
flock "$out/editable-install.lock" pip install -q -c "$constraints" -e ".[test-core]"
# The image's xgrammar, where the release depends on one (1.0 on): the pytorch backend's guided decoding, which
# the fake runs through it.
if grep -q '^xgrammar==' "$pins"; then pip install -q -c "$constraints" xgrammar; fi
echo "== $release: installed in $((SECONDS - t0)) s"

# 3. The pins still hold after the install, and the tests that apply to this release.
mapfile -t tests < <(awk -v r="$release" '!/^#/ && NF { n = split($1, rs, ","); for (i = 1; i <= n; i++) if (rs[i] == "*" || rs[i] == r) { for (f = 2; f <= NF; f++) print $f; break } }' ci/release-tests.txt)
LMI_CI_PINS="$pins" LMI_CI_PINS_NOT_INSTALLED=torch LMI_TRT_FAKE_RELEASE="$release" \
  pytest -q -p no:cacheprovider --junitxml="$out/trtllm-$release.xml" "${tests[@]}"
echo "== $release: done in $((SECONDS - t0)) s"
