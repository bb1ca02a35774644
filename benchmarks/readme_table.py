"""Print the README's summary table from a benchmark results file.

    ./dev run python -m benchmarks.readme_table benchmarks/results/<name>.json
"""

import json
import sys

NUTS = ("blackjax_nuts", "numpyro_nuts", "pymc_nuts", "nutpie")


def table(path):
    results = json.load(open(path))
    runs = [r for r in results["runs"] if r["status"] == "ok"]
    lines = ["| model | sampler | min ESS/grad | vs best NUTS | x^2: min ESS/grad, vs best NUTS "
             "| min ESS/grad incl. warm-up | min ESS/s | max R-hat |",
             "|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        best = max((r["metrics"]["ess_per_grad"]["min"] for r in mine if r["sampler"] in NUTS), default=None)
        best_sq = max((r["metrics"].get("ess_per_grad_squares", {}).get("min", 0.0) for r in mine
                       if r["sampler"] in NUTS), default=None)
        for r in mine:
            m = r["metrics"]
            ratio = m["ess_per_grad"]["min"] / best if best else float("nan")
            squares = m.get("ess_per_grad_squares", {}).get("min", float("nan"))
            ratio_sq = squares / best_sq if best_sq else float("nan")
            lines.append(f"| {model} | {r['sampler']} | {m['ess_per_grad']['min']:.3g} | {ratio:.2f}x | "
                         f"{squares:.3g}, {ratio_sq:.2f}x | "
                         f"{m['ess_per_grad_with_warmup']['min']:.3g} | {m['ess_per_second']['min']:.3g} | "
                         f"{m['rhat_max']:.3f} |")
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    for r in failed:
        lines.append(f"| {r['model']} | {r['sampler']} | failed: {str(r.get('error', r.get('reason', '')))[:60]} | | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
