#!/usr/bin/env bash
# Build a wheel of common (kernel_common) and of every day (or the named ones) for the
# torch and CUDA installed here, so a team builds once and installs everywhere:
#
#   scripts/build_wheels.sh                          # all packages
#   scripts/build_wheels.sh day26_layernorm_backward # common + that day
#   pip install dist/torch-2.13.0+cpu/*.whl          # elsewhere, with that same torch
#
# Wheels land in dist/torch-<torch version>/. An extension runs only with the torch it
# was built against, so each day's wheel requires exactly that torch (in place of
# torch>=2.11) and kernel_common by name (in place of the ../common path, which exists
# only in this checkout). The CUDA part is built when torch is a CUDA build and nvcc is
# found; the architectures are TORCH_CUDA_ARCH_LIST's, else the visible GPUs', else
# 8.0;9.0+PTX (see common/kernel_common/build.py): set it for the GPUs the wheels are for.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
torch_version=$($PY -c 'from importlib import metadata; print(metadata.version("torch"))')
out="$ROOT/dist/torch-$torch_version"
mkdir -p "$out"

pkgs=(common)
if (($#)); then
  for p in "$@"; do [[ -f ${p%/}/setup.py ]] || { echo "no package '$p'" >&2; exit 2; }; pkgs+=("${p%/}"); done
else
  for d in */; do d=${d%/}; [[ $d != common && -f $d/setup.py && -d $d/csrc ]] && pkgs+=("$d"); done
fi

for p in "${pkgs[@]}"; do
  echo "-- [$p] wheel for torch $torch_version"
  t0=$(date +%s)
  before=$(ls "$out")
  (cd "$p" && $PY -m pip wheel -q --no-build-isolation --no-deps -w "$out" .)
  for whl in "$out"/*.whl; do
    grep -qxF "$(basename "$whl")" <<<"$before" && continue
    # Requirements that hold wherever the wheel goes (see the header), and RECORD's
    # hash of the rewritten METADATA, which pip checks on install.
    $PY - "$whl" "$torch_version" <<'PYEOF'
import base64, hashlib, re, shutil, sys, zipfile

whl, torch_version = sys.argv[1], sys.argv[2]
tmp = whl + ".tmp"
with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    names = src.namelist()
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = src.read(meta_name).decode()
    if not whl.endswith("-none-any.whl"):  # kernel_common, pure Python, keeps torch>=2.11
        meta = re.sub(r"^Requires-Dist: torch>=[^;\n]*$", f"Requires-Dist: torch=={torch_version}", meta, flags=re.M)
    meta = re.sub(r"^Requires-Dist: kernel_common @ file:[^;\n]*", "Requires-Dist: kernel_common", meta, flags=re.M)
    data = meta.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    for info in src.infolist():
        body = src.read(info.filename)
        if info.filename == meta_name:
            body = data
        elif info.filename.endswith(".dist-info/RECORD"):
            lines = [f"{meta_name},sha256={digest},{len(data)}" if l.startswith(meta_name + ",") else l
                     for l in body.decode().splitlines()]
            body = ("\n".join(lines) + "\n").encode()
        dst.writestr(info, body)
shutil.move(tmp, whl)
print("   " + whl.rsplit("/", 1)[-1] + ": " +
      ", ".join(l[len("Requires-Dist: "):] for l in meta.splitlines()
                if l.startswith("Requires-Dist:") and "extra ==" not in l))
PYEOF
  done
  echo "   $(( $(date +%s) - t0 )) s"
done
echo "== wheels in $out"
ls -1 "$out"
