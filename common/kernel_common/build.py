"""One way to build every day: setup.py extensions, JIT loading, nvcc compile checks.

Layout of a day (see the top-level README, "Adding a day"):

    dayNN_name/
      setup.py        calls kernel_common.build.setup_day(...)
      csrc/*.cpp      always built (schemas, CPU kernels, pybind11 module)
      csrc/*_cuda.cpp CUDA only: torch glue that validates and launches
      csrc/*.cu       CUDA only: torch-free kernels and their launchers
      <pkg>/          the Python package; the extension is the top-level module <pkg>_C

Policy:
- CUDA is built when torch is a CUDA build and nvcc is found (torch's CUDA_HOME);
  otherwise the CPU part alone. KC_FORCE_CPU=1 forces CPU-only.
- Architectures: TORCH_CUDA_ARCH_LIST if set, else the visible GPUs, else
  DEFAULT_ARCH_LIST (includes 9.0 and PTX); 9.0 is compiled as sm_90a (gencode_flags),
  and -DKC_HAS_SM90A tells host code that sm_90a kernels exist.
- DEBUG=1: -O0 -g -lineinfo (and -DKC_DEBUG, which turns on device asserts).
- The same sources and flags serve setup.py (make_extension), the JIT loader
  (load_jit: edit a .cu, rerun `python test.py --jit`) and the nvcc check that CI
  runs on machines without a CUDA torch (check_cuda_sources).
"""
from __future__ import annotations

import functools
import glob
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
CHECK_ARCHS = ("90a", "80")  # nvcc compile check targets on machines without a CUDA torch (90a: see gencode_flags)


def include_dir() -> str:
    """Folder holding the shared headers (#include "kc/reduce.cuh")."""
    return str(Path(__file__).resolve().parent / "include")


def debug_enabled() -> bool:
    return os.environ.get("DEBUG", "0") == "1"


def nvcc_path() -> str | None:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


def cuda_build_enabled() -> bool:
    """True when this machine can build the CUDA part (CUDA torch + nvcc)."""
    import torch
    from torch.utils import cpp_extension

    if os.environ.get("KC_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST, else the visible GPUs' capabilities, else the default."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    try:
        import torch

        if torch.cuda.is_available():
            caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            return ";".join(f"{a}.{b}" for a, b in caps) + "+PTX"
    except Exception:  # no driver, or a CPU build
        pass
    return DEFAULT_ARCH_LIST


def gencode_flags(archs: str | None = None) -> list[str]:
    """nvcc -gencode flags for an arch list ("8.0;9.0+PTX"). Compute capability 9.0 is
    built as sm_90a, the Hopper-specific target (wgmma, setmaxnreg need it; its code runs
    on 9.0 GPUs only, which is what a 9.0 cubin does anyway); "+PTX" adds the portable
    compute_XY PTX (plain compute_90 for 9.0) so newer GPUs can JIT the rest. torch adds
    no arch flags of its own when these are present."""
    flags = []
    for entry in (archs if archs is not None else arch_list()).replace(" ", ";").split(";"):
        if not entry:
            continue
        ptx = entry.endswith("+PTX")
        base = entry[:-4] if ptx else entry
        num = base.replace(".", "")
        cubin = "90a" if num in ("90", "90a") else num
        flags.append(f"-gencode=arch=compute_{cubin},code=sm_{cubin}")
        if ptx:
            plain = num.rstrip("a")
            flags.append(f"-gencode=arch=compute_{plain},code=compute_{plain}")
    return flags


def arch_macros(gencode: list[str]) -> list[str]:
    """-DKC_HAS_SM90A when the build holds sm_90a code: host code may then pick kernels
    that exist only there (on a 9.0 GPU, the driver loads the sm_90a cubin)."""
    return ["-DKC_HAS_SM90A"] if any("code=sm_90a" in f for f in gencode) else []


@functools.lru_cache(maxsize=None)
def torch_cxx_std() -> str:
    """The C++ standard of the installed torch ("c++20"): the newer of what its headers
    demand (ATen.h's `__cplusplus < ...` guard) and what its cpp_extension passes when a
    build names none. Every compile here uses it, so the nvcc check compiles what
    setup.py and the JIT build compile; torch 2.14 headers reject C++17, older ones
    accept it while cpp_extension already defaults to C++20."""
    import re

    import torch
    from torch.utils import cpp_extension

    years = {14: 2014, 17: 2017, 20: 2020, 23: 2023, 26: 2026}
    found = [17]  # the oldest standard any torch >= 2.11 accepts
    aten = Path(torch.__file__).resolve().parent / "include" / "ATen" / "ATen.h"
    if aten.exists():
        for value in re.findall(r"__cplusplus\s*<\s*(\d{4})\d\dL", aten.read_text()):
            found += [k for k, y in years.items() if y == int(value)]
    source = Path(cpp_extension.__file__).read_text()
    found += [int(n) for n in re.findall(r"['\"](?:-std=)?c\+\+(\d\d)['\"]", source) if int(n) in years]
    return f"c++{max(found)}"


def cxx_flags() -> list[str]:
    flags = [f"-std={torch_cxx_std()}"]
    flags += ["-O0", "-g", "-DKC_DEBUG"] if debug_enabled() else ["-O3"]
    return flags


def nvcc_flags() -> list[str]:
    flags = [f"-std={torch_cxx_std()}", "-lineinfo"]
    flags += ["-O0", "-g", "-DKC_DEBUG"] if debug_enabled() else ["-O3"]
    return flags


def _sources(root: Path, with_cuda: bool) -> list[str]:
    csrc = root / "csrc"
    cpp = sorted(str(p) for p in csrc.glob("*.cpp") if with_cuda or not p.name.endswith("_cuda.cpp"))
    cu = sorted(str(p) for p in csrc.glob("*.cu")) if with_cuda else []
    return cpp + cu


def _common_args(root: Path, with_cuda: bool, gencode: list[str] | None = None) -> dict:
    """Flags of a build. gencode: the -gencode flags (gencode_flags()) for a real CUDA build;
    None for the compile check, which adds one arch per compile itself."""
    macros = ["-DKC_WITH_CUDA"] if with_cuda else []
    macros += arch_macros(gencode or [])
    return dict(
        include_dirs=[include_dir(), str(root / "csrc")],
        cxx=cxx_flags() + macros,
        nvcc=nvcc_flags() + macros + (gencode or []),
    )


def make_extension(pkg: str, root: str | os.PathLike):
    """The setuptools Extension for day `root`, module name `<pkg>_C`."""
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    root = Path(root).resolve()
    with_cuda = cuda_build_enabled()
    args = _common_args(root, with_cuda, gencode_flags() if with_cuda else None)
    rel = [os.path.relpath(s, root) for s in _sources(root, with_cuda)]
    if with_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
        return CUDAExtension(
            f"{pkg}_C", rel, include_dirs=args["include_dirs"],
            extra_compile_args={"cxx": args["cxx"], "nvcc": args["nvcc"]},
        )
    return CppExtension(f"{pkg}_C", rel, include_dirs=args["include_dirs"],
                        extra_compile_args={"cxx": args["cxx"]})


NEEDS_NO_ISOLATION = (
    "This package builds a PyTorch extension against the torch already installed, which an\n"
    "isolated build cannot see. Install torch first (e.g. pip install -r requirements.txt,\n"
    "or requirements-gpu.txt on a GPU machine), then run, in this folder:\n\n"
    "    pip install --no-build-isolation .\n"
)


DEFAULT_EXTRAS = {"test": ["pytest"], "bench": ["matplotlib"]}
# Packages built against one torch release: an extra naming one gets the release that
# matches the installed torch (see matched_requirement), so pip never swaps torch for it.
TORCH_BOUND = ("torchvision",)


def matched_requirement(name: str, torch_version: str) -> str | None:
    """The requirement for `name` (a TORCH_BOUND package) that matches torch_version, or
    None where no release is known to (a pre-release or a torch outside 2.x).
    torchvision 0.(N+15) is built for torch 2.N, and each release pins its torch, so
    `torchvision==0.(N+15).*` beside the exact torch pin resolves to the one for this torch."""
    import re

    m = re.fullmatch(r"2\.(\d+)\.(\d+)(\+[\w.]+)?", torch_version)
    if name == "torchvision" and m:
        return f"torchvision==0.{int(m.group(1)) + 15}.*"
    return None


def extras_for_installed_torch(extras: dict[str, list[str]], torch_version: str,
                               log=lambda msg: sys.stderr.write(msg + "\n")) -> dict[str, list[str]]:
    """Extras that install alongside torch `torch_version`, never replacing it: every extra
    pins torch to it (pip then fails rather than swap torch), and TORCH_BOUND packages
    become their matching release or, where none is known, are left out with a message
    naming the command that installs one by hand."""
    out = {}
    for extra, reqs in extras.items():
        resolved = []
        for req in reqs:
            if req in TORCH_BOUND:
                matched = matched_requirement(req, torch_version)
                if matched is None:
                    log(f"[{extra}] leaves out {req}: no release is known to match torch {torch_version}. "
                        f"Install the build for it without touching torch: pip install --no-deps {req}")
                    continue
                req = matched
            resolved.append(req)
        out[extra] = resolved + [f"torch=={torch_version}"]
    return out


BUILD_INFO = "_build_info.py"


def write_build_info(pkg_dir: Path, root: Path) -> None:
    """Record, inside the package, which torch the extension is built against and where
    its sources are, so a failed load can say so (import_extension). Generated, not in git."""
    import torch

    text = (
        "# Written by kernel_common.build.setup_day at build time: the torch this package's\n"
        "# extension was compiled against, and the sources that rebuild it.\n"
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"TORCH_CUDA = {torch.version.cuda!r}\n"
        f"SOURCE_DIR = {str(root)!r}\n"
    )
    target = pkg_dir / BUILD_INFO
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def setup_day(pkg: str, root: str | os.PathLike, description: str, version: str = "0.1.0",
              extras: dict[str, list[str]] | None = None):
    """Everything a day's setup.py needs: `setup_day("day26_layernorm", __file__-dir, "...")`.

    Metadata lives in the day's pyproject.toml; this adds the extension and the
    dependencies: torch and kernel_common, the latter by path to ../common when the
    day sits in this repo, so one `pip install --no-build-isolation .` installs both.
    `extras` ({"bench": ["matplotlib", "torchvision"]}, default DEFAULT_EXTRAS) become
    the optional dependencies, resolved against the installed torch
    (extras_for_installed_torch). Without torch (a plain `pip install .` builds in an
    isolated env) it stops at once, saying what to type."""
    try:
        import torch
    except ImportError:
        sys.stderr.write("\n" + NEEDS_NO_ISOLATION + "\n")
        raise SystemExit(1)
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension

    root = Path(root).resolve()
    os.chdir(root)
    write_build_info(root / pkg, root)
    common = (root.parent / "common").resolve()
    kc_req = f"kernel_common @ {common.as_uri()}" if (common / "kernel_common").is_dir() else "kernel_common"
    meta = {} if (root / "pyproject.toml").exists() else dict(
        name=pkg, version=version, description=description, python_requires=">=3.10")
    setup(
        **meta,
        packages=[pkg],
        ext_modules=[make_extension(pkg, root)],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
        install_requires=["torch>=2.11", kc_req],
        extras_require=extras_for_installed_torch(extras if extras is not None else DEFAULT_EXTRAS,
                                                  installed_torch_version()),
    )


def installed_torch_version() -> str:
    """torch's version as pip knows it (its distribution's metadata), which is what a
    `torch==` pin is checked against: PyPI's CUDA wheel reports torch.__version__
    "2.15.0+cu132" while its metadata says "2.15.0"."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a source build pip does not know
        import torch

        return torch.__version__


def load_jit(pkg: str, root: str | os.PathLike, verbose: bool = False):
    """Compile and import `<pkg>_C` from the day's sources, with the same flags as setup.py.

    The result is cached by torch (keyed on sources and flags), so the second run is
    fast; an edited .cu is rebuilt. The module lands in sys.modules as `<pkg>_C`, so
    the package's own `import <pkg>_C` finds it.
    """
    from torch.utils.cpp_extension import load

    root = Path(root).resolve()
    with_cuda = cuda_build_enabled()
    if with_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    args = _common_args(root, with_cuda, gencode_flags() if with_cuda else None)
    build_dir = root / "build" / ("jit-debug" if debug_enabled() else "jit")
    build_dir.mkdir(parents=True, exist_ok=True)
    mod = load(
        name=f"{pkg}_C",
        sources=_sources(root, with_cuda),
        extra_include_paths=args["include_dirs"],
        extra_cflags=args["cxx"],
        extra_cuda_cflags=args["nvcc"],
        build_directory=str(build_dir),
        with_cuda=with_cuda,
        verbose=verbose,
    )
    sys.modules[f"{pkg}_C"] = mod
    return mod


# Whether import_extension compiles from source (use_jit) instead of importing the installed
# module. Switched on explicitly by the test runners (`python test.py --jit`, the root
# conftest.py with KC_JIT=1): the library itself reads no environment when a day is imported.
_JIT = {"on": False, "verbose": False}


def use_jit(verbose: bool = False) -> None:
    """From now on, import_extension builds each day's extension from its sources (JIT) instead
    of importing the installed `<pkg>_C`. Call it before the day's package is imported."""
    _JIT["on"], _JIT["verbose"] = True, verbose


def import_extension(pkg: str, root: str | os.PathLike | None = None):
    """What a day's package calls to get its ops registered.

    After use_jit() (as `python test.py --jit` calls) it builds from source; otherwise the
    installed `<pkg>_C` is imported, with a message saying how to build it.
    """
    name = f"{pkg}_C"
    if name in sys.modules:
        return sys.modules[name]
    if _JIT["on"]:
        if root is None:
            raise RuntimeError("a JIT build (use_jit) needs the day's source folder")
        return load_jit(pkg, root, verbose=_JIT["verbose"])
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(load_error_message(pkg, root, e)) from e


def load_error_message(pkg: str, root: str | os.PathLike | None, error: ImportError) -> str:
    """Why `<pkg>_C` did not load, from the build record write_build_info left: not built
    at all, built against another torch (its symbols then do not resolve), or built
    against this one and broken otherwise; each with the command that rebuilds it."""
    import torch

    name = f"{pkg}_C"
    try:
        info = importlib.import_module(f"{pkg}.{BUILD_INFO[:-3]}")
    except ImportError:
        info = None
    source = getattr(info, "SOURCE_DIR", None) or (str(Path(root).resolve()) if root is not None else None)
    # a wheel built elsewhere (scripts/build_wheels.sh) records a folder this machine may lack
    where = f"cd {source} && " if source and Path(source, "setup.py").exists() else "in the day's folder of the repo: "
    rebuild = f"{where}{sys.executable} -m pip install --no-build-isolation ."
    def describe(version, cuda):
        return f"torch {version} ({f'CUDA {cuda}' if cuda else 'CPU only'})"

    running = describe(torch.__version__, torch.version.cuda)
    missing = isinstance(error, ModuleNotFoundError) and error.name == name
    if info is None or missing:  # the record outlives a build that failed after setup.py began
        return (f"{name} is not built. Build it: {rebuild}  "
                f"(or run `python test.py --jit` to compile it on import). ({error})")
    built = describe(info.TORCH_VERSION, info.TORCH_CUDA)
    if info.TORCH_VERSION != torch.__version__ or info.TORCH_CUDA != torch.version.cuda:
        return (f"{name} failed to load: it was built against {built}, and {running} is running; "
                f"an extension loads only with the torch it was built against. Rebuild it for this "
                f"torch: {rebuild}  (or reinstall torch {info.TORCH_VERSION}). ({error})")
    return f"{name} failed to load (built against {built}, the one running). Rebuild it: {rebuild}  ({error})"


# ----------------------------------------------------------------------------
# nvcc compile check for machines with nvcc but no CUDA torch (CI)
# ----------------------------------------------------------------------------

def _torch_nvcc_flags() -> list[str]:
    from torch.utils import cpp_extension

    return list(cpp_extension.COMMON_NVCC_FLAGS)


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout


def _check_key(src: Path, cmd: list[str], headers: list[Path], tool_version: str) -> str:
    """What decides a compile check's result: the source, every header it may include
    (all of csrc/ and kc/: a superset, so an edit to any header rechecks), the command
    line and the compiler's version (and torch's, for the glue's torch headers)."""
    import hashlib

    h = hashlib.sha256()
    for part in (tool_version, "\0".join(cmd)):
        h.update(part.encode()); h.update(b"\0")
    for f in [src, *headers]:
        h.update(str(f).encode()); h.update(f.read_bytes())
    return h.hexdigest()


def check_cuda_sources(root: str | os.PathLike, archs=CHECK_ARCHS, log=print, jobs: int | None = None) -> bool:
    """Compile every csrc/*.cu of `root` with nvcc for each arch in `archs`
    (torch's COMMON_NVCC_FLAGS plus ours), `jobs` at a time (default: one per core),
    and syntax-check the *_cuda.cpp glue with the host compiler against torch's
    headers. A compile whose source, headers, flags and nvcc version are unchanged
    since it last passed is not redone (a key stored under build/nvcc-check).
    Returns True when all pass."""
    import torch
    from concurrent.futures import ThreadPoolExecutor
    from torch.utils import cpp_extension

    root = Path(root).resolve()
    nvcc = shutil.which("nvcc") or nvcc_path()
    if nvcc is None:
        log("  nvcc not found: CUDA compile check skipped")
        return True
    ok = True
    args = _common_args(root, True)
    incs = [f"-I{d}" for d in args["include_dirs"]]
    out_dir = root / "build" / "nvcc-check"
    out_dir.mkdir(parents=True, exist_ok=True)
    version = _nvcc_version(nvcc)
    headers = sorted(p for d in [root / "csrc", Path(include_dir())] for p in d.rglob("*")
                     if p.suffix in (".h", ".cuh", ".hpp", ".inl"))

    # torch-side CUDA glue: syntax only (no CUDA torch libraries to link here)
    cuda_home = Path(nvcc).resolve().parent.parent
    torch_incs = [f"-I{p}" for p in cpp_extension.include_paths()]
    # A CPU wheel of torch ships c10/cuda headers but not the generated
    # cuda_cmake_macros.h they include: stand in a minimal one for the check.
    if not any(Path(p, "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in cpp_extension.include_paths()):
        stub = out_dir / "stub" / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        torch_incs.append(f"-I{out_dir / 'stub'}")
    cxx = os.environ.get("CXX", "c++")
    cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout + torch.__version__

    # (label, source, command, stamp, tool version): every compile the check runs
    tasks = []
    for cu in sorted((root / "csrc").glob("*.cu")):
        for arch in archs:
            obj = out_dir / f"{cu.stem}.sm{arch}.o"
            gencode = [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
            cmd = [nvcc, "-c", str(cu), "-o", str(obj), *gencode, "-Xptxas", "-warn-spills",
                   *_torch_nvcc_flags(), *args["nvcc"], *arch_macros(gencode), *incs]
            tasks.append((f"nvcc sm_{arch} {cu.relative_to(root)}", cu, cmd, obj.with_suffix(".key"), version))
    for cpp in sorted((root / "csrc").glob("*_cuda.cpp")):
        cmd = [cxx, "-fsyntax-only", f"-std={torch_cxx_std()}", str(cpp), "-DKC_WITH_CUDA", *incs, *torch_incs,
               f"-I{cuda_home / 'include'}", "-I/usr/local/cuda/include",
               f"-I{sysconfig_include()}", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
        tasks.append((f"c++ -fsyntax-only {cpp.relative_to(root)}", cpp, cmd,
                      out_dir / f"{cpp.stem}.syntax.key", cxx_version))

    def one(task):
        label, src, cmd, stamp, tool_version = task
        key = _check_key(src, cmd, headers, tool_version)
        if stamp.exists() and stamp.read_text() == key:
            return label, True, "ok (unchanged)", ""
        stamp.unlink(missing_ok=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:
            stamp.write_text(key)
        return label, r.returncode == 0, "ok" if r.returncode == 0 else "FAILED", r.stdout + r.stderr

    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        for label, good, status, out in pool.map(one, tasks):
            log(f"  {label}: {status}")
            if not good:
                ok = False
                log(out)
    return ok


def sysconfig_include() -> str:
    import sysconfig

    return sysconfig.get_paths()["include"]


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kernel_common.build")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-cuda", help="nvcc compile check of a day's .cu files")
    c.add_argument("root")
    c.add_argument("-j", "--jobs", type=int, default=None, help="compiles at a time (default: one per core)")
    sub.add_parser("info", help="print the build decisions for this machine")
    a = p.parse_args(argv)
    if a.cmd == "check-cuda":
        return 0 if check_cuda_sources(a.root, jobs=a.jobs) else 1
    print(f"cuda build: {cuda_build_enabled()}  arch list: {arch_list()}  nvcc: {nvcc_path()}  debug: {debug_enabled()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
