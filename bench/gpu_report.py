"""bench/gpu_report.py: the Markdown tables of bench/run_gpu.sh, from the files it wrote.

    python3 bench/gpu_report.py DIR > DIR/results.md

Reads from DIR (each optional): env.txt (key=value lines: the GPU from nvidia-smi, what
ddplua and torch see, commit, date, command), parity.log and specs.log (busted's output
through spec/helpers/ci_output.lua: the summary line and the failing tests' names),
gemm.txt and train.txt (one key=value line per run from bench/gpu_gemm*.{lua,py} and
bench/gpu_train*.{lua,py}). Medians over the runs; ratios ddplua / PyTorch (higher is
better for ddplua). Needs only the standard library.
"""
import os
import re
import statistics
import sys


def kv_lines(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            d = {}
            for tok in line.split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    d[k] = v
            if "framework" in d:
                rows.append(d)
    return rows


def env(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    out.setdefault(k, v)
    return out


def busted_summary(path):
    """The last "N passed, N failed, N skipped" line of a busted log (spec/helpers/ci_output.lua)
    and the names of the failing tests (the line after each "Failure →" / "Error →")."""
    summary, failing = None, []
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\d+ passed, \d+ failed, \d+ skipped", line):
            summary = line.strip()
        if re.match(r"^(Failure|Error) → ", line) and i + 1 < len(lines):
            failing.append(lines[i + 1].strip())
    return summary, failing


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median_low(xs) if xs else None


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    e = env(os.path.join(d, "env.txt"))
    gpu = e.get("gpu", "unknown GPU (nvidia-smi gave nothing)")
    print(f"# ddplua on one GPU: {gpu}")
    print()
    print(f"Written by bench/run_gpu.sh (`{e.get('command', '?')}`). Commit {e.get('commit', '?')}, "
          f"{e.get('date', '?')}.")
    print()
    if "bundle" in e:
        print(f"- Runtime from bench/gpu_bundle.sh's bundle: {e['bundle']}")
    print(f"- GPU: {gpu}; driver {e.get('driver', '?')}; {e.get('gpu_memory', '?')}")
    print(f"- ddplua: CUDA available {e.get('cuda_available', '?')}, plug-in {e.get('cuda_backend', '?')}, "
          f"{e.get('cuda_versions', 'versions ?')}; Lua device API: {e.get('lua_device_api', '?')}"
          + (f"; not available: {e['cuda_reason']}" if 'cuda_reason' in e else ""))
    print(f"- PyTorch: {e.get('torch', '?')}")
    print()
    for name, title in (("parity", "Backend ops against the CPU (spec/backend_ops_spec.lua)"),
                        ("specs", "All #cuda specs (busted --tags=cuda spec)")):
        path = os.path.join(d, name + ".log")
        if not os.path.exists(path):
            continue
        print(f"## {title}")
        print()
        summary, failing = busted_summary(path)
        print(summary or f"(no summary line: see {name}.log)")
        if failing:
            print()
            print(f"Failing ({len(failing)}; the first 60; messages in {name}.log):")
            print()
            for t in failing[:60]:
                print(f"- {t}")
        print()

    gemm = kv_lines(os.path.join(d, "gemm.txt"))
    if gemm:
        rounds = max(sum(1 for r in gemm if r["framework"] == fw and r.get("mode") == gemm[0].get("mode")
                         and r.get("n") == gemm[0].get("n")) for fw in ("ddplua", "torch"))
        print(f"## Matrix product, n × n × n (bench/gpu_gemm.lua vs torch.matmul)")
        print()
        print(f"TFLOP/s = 2n³ / time; medians of {rounds} alternating rounds, each the median of its trials. "
              "Relative error against an f64 CPU product of the same inputs, at the smallest size.")
        print()
        print("| mode | n | ddplua / PyTorch | ddplua TFLOP/s | PyTorch TFLOP/s | ddplua ms | PyTorch ms "
              "| ddplua rel. error | PyTorch rel. error |")
        print("|---|---|---|---|---|---|---|---|---|")
        keys = []
        for r in gemm:
            k = (r.get("mode"), r.get("n"))
            if k not in keys and "tflops" in r:
                keys.append(k)
        for mode, n in keys:
            sel = {fw: [r for r in gemm if r["framework"] == fw and r.get("mode") == mode and r.get("n") == n]
                   for fw in ("ddplua", "torch")}
            tf = {fw: med(num(r.get("tflops")) for r in rows) for fw, rows in sel.items()}
            ms = {fw: med(num(r.get("ms")) for r in rows) for fw, rows in sel.items()}
            err = {fw: next((r["rel_err"] for r in rows if r.get("rel_err") not in (None, "-")), "—")
                   for fw, rows in sel.items()}
            print(f"| {mode} | {n} | {ratio(tf['ddplua'], tf['torch'])} | {fmt(tf['ddplua'], 2)} | "
                  f"{fmt(tf['torch'], 2)} | {fmt(ms['ddplua'], 3)} | {fmt(ms['torch'], 3)} | {err['ddplua']} | "
                  f"{err['torch']} |")
        print()

    train = kv_lines(os.path.join(d, "train.txt"))
    if train:
        print("## Training throughput, one GPU (bench/gpu_train.lua vs PyTorch eager)")
        print()
        print("Random device-resident batches, SGD as in the configs; samples/s over the timed steps "
              "(after the warm-up), medians of the alternating runs (count in the last column). "
              "PyTorch with cudnn.benchmark; TF32 as in the column, for matmul and convolution alike.")
        print()
        print("| model | batch | TF32 | ddplua / PyTorch | ddplua samples/s | PyTorch samples/s | ddplua ms/step "
              "| PyTorch ms/step | ddplua peak MiB | PyTorch peak MiB | runs (ddplua, PyTorch) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        keys = []
        for r in train:
            k = (r.get("model"), r.get("batch"), r.get("tf32"))
            if k not in keys:
                keys.append(k)
        for model, batch, tf32 in keys:
            sel = {fw: [r for r in train if r["framework"] == fw and r.get("model") == model
                        and r.get("batch") == batch and r.get("tf32") == tf32] for fw in ("ddplua", "torch")}
            sps = {fw: med(num(r.get("samples_per_s")) for r in rows) for fw, rows in sel.items()}
            ms = {fw: med(num(r.get("step_ms")) for r in rows) for fw, rows in sel.items()}
            mem = {fw: med(num(r.get("peak_mem_mb")) for r in rows) for fw, rows in sel.items()}
            print(f"| {model} | {batch} | {'on' if tf32 == '1' else 'off'} | {ratio(sps['ddplua'], sps['torch'])} | "
                  f"{fmt(sps['ddplua'])} | {fmt(sps['torch'])} | {fmt(ms['ddplua'], 2)} | {fmt(ms['torch'], 2)} | "
                  f"{fmt(mem['ddplua'])} | {fmt(mem['torch'])} | {len(sel['ddplua'])}, {len(sel['torch'])} |")
        print()
    fails = os.path.join(d, "failures.txt")
    if os.path.exists(fails) and os.path.getsize(fails) > 0:
        print("## Runs that failed")
        print()
        with open(fails) as f:
            for line in f.read().strip().splitlines()[:40]:
                print(f"- {line}")
        print()


main()
