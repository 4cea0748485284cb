"""Turn bench_spectral.py JSON output into the markdown table of benchmarks/RESULTS.md.

Usage: ``python benchmarks/results_table.py out_torch.json [out_jax.json ...]``
"""

from __future__ import annotations

import json
import sys


def rows(path: str) -> list[str]:
    with open(path) as fh:
        data = json.load(fh)
    out = []
    for r in data["rows"]:
        off = r.get("step_official")
        official = f"{off / r['step_ours']:.1f}×" if off else "—"
        out.append(
            f"| {r['framework']} | {r['dtype']} | {r['N']}×{r['D']} | "
            f"{r['reg_svdvals'] / r['reg_ours']:.2f}× | {official} | "
            f"{r['step_svdvals'] / r['step_ours']:.2f}× | {r['step_ours'] / r['gemm']:.1f} | "
            f"{r['reg_ours'] * 1e3:.2f} | {r['step_ours'] * 1e3:.1f} | {r['gemm'] * 1e3:.2f} | "
            f"{r['accuracy']:.1e} |"
        )
    return out


def main(paths: list[str]) -> None:
    print(
        "| framework | dtype | N×D | reg: svdvals-AD / condreg | step: official / condreg | "
        "step: svdvals-AD / condreg | step in GEMMs | reg ms | step ms | GEMM ms | "
        "max rel. diff. vs SVD path |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        for line in rows(p):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
