#!/usr/bin/env bash
# Creates a separate virtualenv with torchft for the benchmarks' torchft column (figure 12, `live`).
# Never install it into the project's own environment.
#   usage: bash benchmarks/setup_torchft.sh VENV_DIR [PYTHON] [VERSION]
# then:   RVSUP_BENCH_TORCHFT_VENV=VENV_DIR python -m benchmarks --quick --only live
#         (or --torchft-venv VENV_DIR)
#
# VERSION defaults to 0.2.0. Its wheels are built per CPython version for manylinux_2_17 (glibc
# 2.17 or newer), so pip installs the release's own wheel on Debian 12 (glibc 2.36) with Python
# 3.11: `torchft-0.2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl`. The lighthouse
# is compiled Rust inside that wheel: the extension `torchft._torchft` and the console script
# `torchft_lighthouse` that calls it; nothing is built here. torchft asks for torch>=2.7 and
# OpenTelemetry; torch is installed first at the project's version, and the script checks that
# installing torchft left it there.
set -euo pipefail
venv="${1:?usage: setup_torchft.sh VENV_DIR [PYTHON] [VERSION]}"
python="${2:-python3}"
version="${3:-0.2.0}"
torch_version="2.13.0"
"$python" -m venv "$venv"
# the same torch as the project, installed first so that torchft does not pull another one
"$venv/bin/pip" install --quiet "torch==$torch_version"
"$venv/bin/pip" install --quiet "torchft==$version" "torch==$torch_version"
"$venv/bin/python" - "$torch_version" <<'EOF'
import sys

import torch
import torchft  # noqa: F401 -- the Manager, its DDP and ProcessGroupGloo
from torchft._torchft import LighthouseServer  # noqa: F401 -- the compiled lighthouse

want = sys.argv[1]
if torch.__version__.split("+")[0] != want:
    sys.exit(f"torch {torch.__version__} was installed instead of {want}")
EOF
"$venv/bin/torchft_lighthouse" --help > /dev/null
echo "torchft $version ready in $venv (torch $torch_version)"
