#!/usr/bin/env bash
# Virtual environments holding axolotl and LLaMA-Factory, each at the newest version on the package index, for
# tests/test_export_thirdparty.py: the exports are loaded there by each tool's own parser and validator.
#
# Neither tool is a dependency of vram-advisor, and a full install pulls GPU-only packages (xformers, triton,
# flash-linear-attention, vLLM's and gradio's trees, several GB). So each tool goes in with --no-deps, and beside it
# exactly what its config parsing imports, at the versions the tool pins (its wheel's Requires-Dist). The venvs see
# this Python's site-packages (--system-site-packages) for the rest (torch, numpy, PyYAML): the pinned packages
# installed into the venv shadow the project's own versions there.
#
# Cached under $ADVISOR_THIRDPARTY_CACHE (default ~/.cache/vram-advisor/thirdparty), one folder per tool,
# version and Python, marked complete by a stamp holding its pins: a rerun with the same pins reuses it.
# Prints `export ADVISOR_AXOLOTL_PYTHON=... ADVISOR_LLAMAFACTORY_PYTHON=...` lines for eval.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1
cache=${ADVISOR_THIRDPARTY_CACHE:-$HOME/.cache/vram-advisor/thirdparty}
py=${PYTHON:-python3}
pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

# axolotl 0.19.0 is the newest on the index here (0.21.0 would need Python 3.12; 0.19.0 takes >=3.10).
# Its pins for what axolotl.utils.config.validate_config and its plugins import (transformers, pydantic,
# accelerate, the hub, peft, datasets; addict unpinned). kernels: the range each tool's transformers takes
# (transformers imports it at once); the project's own transformers pulls a newer one into site-packages.
AXOLOTL="axolotl==0.19.0"
AXOLOTL_DEPS="transformers==5.16.1 pydantic==2.12.5 accelerate==1.13.0 huggingface_hub==1.17.0 peft==0.20.0
  PyYAML==6.0.3 datasets==4.8.4 addict kernels==0.16.2"
# LLaMA-Factory 0.9.5: the highest versions its requirements allow for what hparams.parser imports.
# liger-kernel: its presence only (LLaMA-Factory checks the installed version for enable_liger_kernel; the kernels
# need a GPU and triton, so it goes in without dependencies).
LLAMAFACTORY="llamafactory==0.9.5 liger-kernel==0.8.1"
LLAMAFACTORY_DEPS="transformers==5.6.0 peft==0.18.1 trl==0.24.0 accelerate==1.11.0 datasets==4.0.0 omegaconf
  kernels==0.12.3"

build() {  # name "packages installed without dependencies" "packages installed with theirs" -> the venv's python
  local name=$1 tool=$2 deps=$3
  local first=${tool%% *}
  local dir="$cache/${first//==/-}-py$pyver"
  local stamp="$tool $(echo $deps)"
  if [ -f "$dir/.complete" ] && [ "$(cat "$dir/.complete")" = "$stamp" ]; then
    echo "$dir/bin/python"; return
  fi
  rm -rf "$dir"
  mkdir -p "$cache"
  local start=$SECONDS
  "$py" -m venv --system-site-packages "$dir" >&2
  # shellcheck disable=SC2086
  "$dir/bin/python" -m pip install -q --no-deps $tool >&2
  # shellcheck disable=SC2086
  "$dir/bin/python" -m pip install -q $deps 2>&1 | grep -v "dependency conflicts\|requires\|incompatible" >&2 || true
  echo "$stamp" > "$dir/.complete"
  echo "thirdparty: built $name ($tool) in $((SECONDS - start)) s at $dir" >&2
  echo "$dir/bin/python"
}

ax=$(build axolotl "$AXOLOTL" "$AXOLOTL_DEPS")
lf=$(build llamafactory "$LLAMAFACTORY" "$LLAMAFACTORY_DEPS")
"$ax" -c "from axolotl.utils.config import validate_config" >/dev/null 2>&1 \
  || { echo "thirdparty: axolotl does not import in $ax" >&2; exit 1; }
"$lf" -c "from llamafactory.hparams.parser import get_train_args" >/dev/null 2>&1 \
  || { echo "thirdparty: llamafactory does not import in $lf" >&2; exit 1; }
echo "export ADVISOR_AXOLOTL_PYTHON=$ax"
echo "export ADVISOR_LLAMAFACTORY_PYTHON=$lf"
