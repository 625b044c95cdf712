#!/usr/bin/env bash
# Creates a separate virtualenv with NVIDIA's resiliency extension (ft_launcher) for the benchmarks'
# ft_launcher column. Never install it into the project's own environment.
#   usage: bash benchmarks/setup_nvrx.sh VENV_DIR [PYTHON] [VERSION]
# then:   RVSUP_BENCH_NVRX_VENV=VENV_DIR python -m benchmarks --quick   (or --nvrx-venv VENV_DIR)
#
# VERSION defaults to 0.7.0, the newest release. Its wheels (like 0.5.0's and 0.6.0's) are built
# for glibc 2.39 (manylinux_2_39) and, for 0.7.0, CPython 3.12 and 3.14 only, so pip refuses them
# on an older system (Debian 12 has glibc 2.36) or with Python 3.11, where it picks 0.4.1 instead.
# The launcher and the rank monitor are pure Python; the wheel's one compiled module is the CUPTI
# extension of the GPU straggler detector, which a CPU run never loads. So this script downloads
# the release's wheel, drops that module, retags the rest as pure Python and installs it: the
# launcher we compare against is exactly the release's code. Set VERSION=0.4.1 for the version
# pip itself installs here (the one of the runs before R16).
set -euo pipefail
venv="${1:?usage: setup_nvrx.sh VENV_DIR [PYTHON] [VERSION]}"
python="${2:-python3}"
version="${3:-0.7.0}"
"$python" -m venv "$venv"
# the same torch as the project, installed first so that the extension does not pull another one
"$venv/bin/pip" install --quiet "torch==2.13.0"
if [ "$version" = 0.4.1 ]; then
  "$venv/bin/pip" install --quiet "nvidia-resiliency-ext==$version"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$venv/bin/pip" install --quiet wheel
  "$venv/bin/pip" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform "manylinux_2_39_$(uname -m)" --dest "$work/dl" "nvidia-resiliency-ext==$version"
  "$venv/bin/python" -m wheel unpack --dest "$work/unpacked" "$work"/dl/*.whl
  tree="$work/unpacked/nvidia_resiliency_ext-$version"
  rm -f "$tree"/nvrx_cupti_module.*.so
  sed -i 's/^Tag: .*/Tag: py3-none-any/; s/^Root-Is-Purelib: .*/Root-Is-Purelib: true/' \
    "$tree"/*.dist-info/WHEEL
  grep -v '^nvrx_cupti_module\.' "$tree"/*.dist-info/RECORD > "$work/RECORD"
  cp "$work/RECORD" "$tree"/*.dist-info/RECORD
  mkdir -p "$work/repacked"
  "$venv/bin/python" -m wheel pack --dest-dir "$work/repacked" "$tree"
  "$venv/bin/pip" install --quiet "$work"/repacked/*.whl
fi
"$venv/bin/ft_launcher" --help > /dev/null
"$venv/bin/python" -c 'import nvidia_resiliency_ext.fault_tolerance' # the rank monitor's client
echo "ft_launcher $version ready in $venv"
