"""How long does nvcc take per source, and how many kernels does each hold? (CPU, nvcc only.)

Compiles each csrc/*.cu for one arch (default sm_90a), serially, with the command of the
project's nvcc compile check (kernel_common.build: torch's COMMON_NVCC_FLAGS, nvcc_flags,
arch_macros), and prints the seconds per file, the number of kernels in its cubin (the
`.nv.info.<kernel>` sections, read with readelf from nvcc's --keep output) and the total.
Nothing is cached: every file is compiled each run.

    python tools/build_time.py [--arch 90a] [--files layernorm_fwd_v4.cu ...] [--repeat N] [--root DIR] [--jobs N]

--jobs N: also compile the whole list N at a time (as the build does with MAX_JOBS=N) and
print that wall time after the serial table.

--root: another copy of this day's folder (e.g. `git archive main day26_layernorm_backward`
unpacked somewhere), to time its sources with the same command.
"""
import argparse
import concurrent.futures
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernel_common import build

ROOT = Path(__file__).resolve().parent.parent


def command(cu: Path, arch: str, out_dir: Path) -> list[str]:
    """The compile check's nvcc command for one source and one arch, keeping the cubin."""
    nvcc = shutil.which("nvcc") or build.nvcc_path()
    args = build._common_args(ROOT, True)
    gencode = [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    return [nvcc, "-c", str(cu), "-o", str(out_dir / f"{cu.stem}.o"), *gencode, "-Xptxas", "-warn-spills",
            *build._torch_nvcc_flags(), *args["nvcc"], *build.arch_macros(gencode),
            *[f"-I{d}" for d in args["include_dirs"]], "--keep", f"--keep-dir={out_dir}"]


def count_kernels(out_dir: Path) -> int:
    """Kernels in the kept cubins: each entry point has its own `.nv.info.<name>` section
    (device functions do not), whether its symbol is global or, in an anonymous namespace, local."""
    n = 0
    for cubin in out_dir.glob("*.cubin"):
        sections = subprocess.run(["readelf", "-SW", str(cubin)], capture_output=True, text=True, check=True).stdout
        n += len(re.findall(r"\]\s+\.nv\.info\.\S+", sections))
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="90a", help="one arch, as in sm_XX (default 90a)")
    p.add_argument("--files", nargs="*", help="csrc/ file names (default: every .cu)")
    p.add_argument("--repeat", type=int, default=1, help="runs of the whole list (default 1)")
    p.add_argument("--jobs", type=int, default=0, help="also time the list compiled N at a time")
    p.add_argument("--root", type=Path, default=None, help="the day's folder to time (default: this one)")
    a = p.parse_args()
    global ROOT
    if a.root is not None:
        ROOT = a.root.resolve()
    files = [ROOT / "csrc" / f for f in a.files] if a.files else sorted((ROOT / "csrc").glob("*.cu"))
    for run in range(a.repeat):
        print(f"run {run + 1}: nvcc sm_{a.arch}, serial")
        total, kernels = 0.0, 0
        for cu in files:
            with tempfile.TemporaryDirectory() as tmp:
                cmd = command(cu, a.arch, Path(tmp))
                t0 = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True)
                dt = time.perf_counter() - t0
                if r.returncode != 0:
                    print(r.stdout + r.stderr)
                    print(f"{cu.name}: FAILED")
                    return 1
                k = count_kernels(Path(tmp))
            total += dt
            kernels += k
            print(f"  {cu.name:28s} {dt:6.1f} s  {k:4d} kernels", flush=True)
        print(f"  {'total':28s} {total:6.1f} s  {kernels:4d} kernels", flush=True)
        if a.jobs > 1 and not parallel_wall(files, a.arch, a.jobs):
            return 1
    return 0


def parallel_wall(files: list[Path], arch: str, jobs: int) -> bool:
    """Compile every file, `jobs` at a time, and print the wall time of the whole list."""
    def one(cu: Path) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp:
            return subprocess.run(command(cu, arch, Path(tmp)), capture_output=True, text=True)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(one, files))
    dt = time.perf_counter() - t0
    for cu, r in zip(files, results):
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print(f"{cu.name}: FAILED")
            return False
    print(f"  {f'wall, {jobs} at a time':28s} {dt:6.1f} s", flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
