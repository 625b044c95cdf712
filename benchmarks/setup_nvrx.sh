#!/usr/bin/env bash
# Creates a separate virtualenv with NVIDIA's resiliency extension (ft_launcher) for the benchmarks'
# ft_launcher column. Never install it into the project's own environment.
#   usage: bash benchmarks/setup_nvrx.sh VENV_DIR [PYTHON]
# then:   RVSUP_BENCH_NVRX_VENV=VENV_DIR python -m benchmarks --quick   (or --nvrx-venv VENV_DIR)
set -euo pipefail
venv="${1:?usage: setup_nvrx.sh VENV_DIR [PYTHON]}"
python="${2:-python3}"
"$python" -m venv "$venv"
# the same torch as the project, installed first so that the extension does not pull another one
"$venv/bin/pip" install --quiet "torch==2.13.0"
"$venv/bin/pip" install --quiet "nvidia-resiliency-ext==0.4.1"
"$venv/bin/ft_launcher" --help > /dev/null
echo "ft_launcher ready in $venv"
