"""Where a training step's GPU time goes, day50 against SDPA: one step of each model under the
torch profiler, kernel time summed by kernel name, the names whose time differs most first.
Run on a GPU machine with day50 and common installed, from day50_attention_backward/:
    python tools/profile_step.py [gpt2 llama llama_packed] [--top 14] [--out FILE]
The steps are the models bench's (kernel_common.models): bf16 autocast, grads set to None,
day50 through register_transformers(). Times are one profiled step after three warm-up steps
(eager, so the figures carry the profiler's small per-kernel overhead on both sides).
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import day50_attention as da
from kernel_common import models


def short(name: str) -> str:
    for junk in ("(anonymous namespace)::", "void ", "at::native::", "at::"):
        name = name.replace(junk, "")
    return name.split("<")[0].split("(")[0][:60]


def kernel_times(spec, model, x, y) -> tuple[collections.Counter, collections.Counter]:
    step = models.make_step(spec, model, x, y)
    for _ in range(3):
        models.clear_grads(model)
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        models.clear_grads(model)
        step()
        torch.cuda.synchronize()
    us, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[short(e.name)] += e.time_range.elapsed_us()
            count[short(e.name)] += 1
    return us, count


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", default=["gpt2", "llama"])
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    name = da.register_transformers()
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: kernel time of one step, us"]
    for m in a.models:
        spec = models.build(m, torch.device("cuda"))
        x, y = spec.make_inputs(torch.Generator().manual_seed(0))
        torch_us, torch_n = kernel_times(spec, spec.model, x, y)
        ours = models.apply_swap(spec, spec.model, "day50", models.Swap(hf_attention=name), {})
        day50_us, day50_n = kernel_times(spec, ours, x, y)
        t_sum, d_sum = sum(torch_us.values()), sum(day50_us.values())
        lines.append(f"\n## {m}: all kernels SDPA {t_sum:.0f} us ({sum(torch_n.values())} launches), "
                     f"day50 {d_sum:.0f} us ({sum(day50_n.values())} launches), day50 - SDPA {d_sum - t_sum:+.0f} us")
        lines.append(f"{'kernel':60} {'SDPA us':>9} {'n':>4} {'day50 us':>9} {'n':>4} {'diff':>8}")
        names = sorted(set(torch_us) | set(day50_us), key=lambda k: -abs(day50_us[k] - torch_us[k]))
        for k in names[:a.top]:
            lines.append(f"{k:60} {torch_us[k]:9.0f} {torch_n[k]:4d} {day50_us[k]:9.0f} {day50_n[k]:4d} "
                         f"{day50_us[k] - torch_us[k]:+8.0f}")
        del spec, ours
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
