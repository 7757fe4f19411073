"""Tables of ``research/transfer.py``'s JSON lines: docs/research/transfer.md and
the transfer section of docs/research/results.md.

    python -m research.transfer_report LINES [LINES ...] [--docs docs]

Several files may be given: rows that two files share (same setting, fold, pool,
method and n) are taken from the first, each fine-tuned row is labelled with the
``--finetune`` parameters of its run, and each refined row of a run with another
``--refine`` than the default with its steps and penalty, so runs that differ only
in the fine-tuning recipe or the refinement read as one table.
Without ``--docs`` the full page is printed.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

FINETUNE_MODELS = 20
ZERO_SHOT = "LOCUS zero-shot, refined"
FORWARD = "LOCUS zero-shot, forward"
SCRATCH = f"LOCUS scratch on {FINETUNE_MODELS}, refined"
BASELINES = ("overall accuracy", "MF (dim 16)")
REFINE = [50, 0.1]  # research/transfer.py's default --refine
PASSES = (("forward", "before (forward pass)"), ("refined", "after (refined)"))
BEGIN = "<!-- transfer: written by research/transfer_report.py -->"
END = "<!-- end of transfer -->"


def _recipe(finetune):
    return " ".join(finetune) if finetune else "defaults"


def load(paths):
    """Score, fit and novelty records of several runs, fine-tuned rows relabelled."""
    seen, records = set(), []
    for path in paths:
        lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
        recipes = {r["fold"]: r["finetune"] for r in lines if r["kind"] == "fit"}
        for record in lines:
            record = dict(record)
            finetune = record.get("finetune", recipes.get(record["fold"]))
            refine = record.get("refine", REFINE)
            if refine != REFINE and record.get("method", "").endswith(", refined"):
                steps, penalty = refine
                record["method"] += f" [{steps:g} steps, penalty {penalty:g}]"
            for field in ("method", "embedder"):
                label = record.get(field, "")
                if "fine-tuned" in label:
                    record[field] = label.replace(
                        f"on {FINETUNE_MODELS}",
                        f"on {FINETUNE_MODELS} [{_recipe(finetune)}]",
                    )
            key = tuple(
                record.get(k)
                for k in ("kind", "setting", "fold", "pool", "method", "n")
            ) + (record.get("embedder"), record.get("queries"))
            if key not in seen:
                seen.add(key)
                records.append(record)
    return records


def _cell(values):
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return f"{values.mean():.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


def _mean_cell(figures, method, n):
    """The correctness cell of ``method`` at ``n``: mean over pools ± sd."""
    return _cell([v[0] for v in figures[method, n].values()])


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def _figures(scores, setting, fold):
    """{(method, n): {pool: (correctness, routing)}} of one setting and fold."""
    out = {}
    for row in scores:
        if row["setting"] == setting and row["fold"] == fold:
            out.setdefault((row["method"], row["n"]), {})[row["pool"]] = (
                row["correctness"],
                row["routing"],
            )
    return out


def _difference(figures, method, against, n, metric):
    """Per-pool differences of ``method`` minus ``against`` at ``n``."""
    a, b = figures.get((method, n), {}), figures.get((against, n), {})
    return [a[p][metric] - b[p][metric] for p in sorted(a) if p in b]


def _methods(figures):
    return list(dict.fromkeys(m for m, _ in figures))


def _fine_tuned(scores):
    return list(
        dict.fromkeys(
            r["method"]
            for r in scores
            if "fine-tuned" in r["method"] and r["method"].endswith("refined")
        )
    )


def fold_tables(scores):
    parts = []
    for fold in dict.fromkeys(row["fold"] for row in scores):
        figures = _figures(scores, "transfer", fold)
        sizes = sorted({n for _, n in figures})
        pools = sorted({p for f in figures.values() for p in f})
        test = next(r["n_test"] for r in scores if r["fold"] == fold)
        rows = []
        for metric, name in ((0, "correctness"), (1, "routing")):
            rows.append([f"**{name}**"] + [""] * len(sizes))
            for method in _methods(figures):
                rows.append(
                    [method]
                    + [
                        _cell([v[metric] for v in figures[method, n].values()])
                        if (method, n) in figures
                        else ""
                        for n in sizes
                    ]
                )
        parts.append(
            f"### {fold} left out ({test} test queries, pools {pools})\n\n"
            + _table(["method"] + [f"n = {n}" for n in sizes], rows)
        )
    return parts


def differences(scores):
    comparisons = [(ZERO_SHOT, b) for b in (*BASELINES, FORWARD)]
    comparisons += [(SCRATCH, b) for b in (*BASELINES, ZERO_SHOT)]
    for tuned in _fine_tuned(scores):
        comparisons += [(tuned, b) for b in (SCRATCH, ZERO_SHOT, *BASELINES)]
    for method in dict.fromkeys(r["method"] for r in scores):
        if ", refined [" in method:
            comparisons.append((method, method[: method.rindex(" [")]))
    rows = []
    for method, against in comparisons:
        for fold in dict.fromkeys(row["fold"] for row in scores):
            figures = _figures(scores, "transfer", fold)
            for n in sorted({n for _, n in figures}):
                cells = []
                for metric in (0, 1):
                    found = _difference(figures, method, against, n, metric)
                    cells.append(_cell(found) if found else "")
                if any(cells):
                    rows.append([method, against, fold, n, *cells])
    return "### Differences, paired by pool (mean ± sd over pools)\n\n" + _table(
        ["method", "minus", "fold", "n", "correctness", "routing"], rows
    )


def _smallest(figures, method, against, sizes):
    """Smallest over ``sizes`` of the mean paired difference ``method - against``."""
    means = [
        np.mean(found)
        for n in sizes
        if (found := _difference(figures, method, against, n, 0))
    ]
    return min(means) if len(means) == len(sizes) else None


def _verdict(smallest, strict):
    if smallest is None:
        return "not measured"
    met = smallest > 0 if strict else smallest >= 0
    return f"{'yes' if met else 'no'} ({smallest:+.3f})"


def _targets(scores):
    """The issue's targets as (label, pairs to compare, from which n, strict)."""
    targets = [
        (
            "zero-shot matches overall accuracy at every n",
            [(ZERO_SHOT, BASELINES[0])],
            0,
            False,
        ),
        (
            "zero-shot beats overall accuracy and MF from n = 64",
            [(ZERO_SHOT, b) for b in BASELINES],
            64,
            True,
        ),
    ]
    for tuned in _fine_tuned(scores):
        recipe = tuned.removeprefix("LOCUS ").removesuffix(", refined")
        label = f"{recipe} beats scratch on {FINETUNE_MODELS} and zero-shot from n = 64"
        targets.append((label, [(tuned, SCRATCH), (tuned, ZERO_SHOT)], 64, True))
    return targets


def verdict_table(scores):
    """The targets of zero-shot transfer and fine-tuning, fold by fold.

    A target is met when the mean over pools of the paired correctness
    difference is >= 0 ("matches") or > 0 ("beats") at every n it covers; each
    cell gives the smallest such difference.
    """
    folds = list(dict.fromkeys(row["fold"] for row in scores))
    rows = []
    for label, pairs, from_n, strict in _targets(scores):
        cells = []
        for fold in folds:
            figures = _figures(scores, "transfer", fold)
            sizes = sorted({n for _, n in figures if n >= from_n})
            found = [_smallest(figures, m, b, sizes) for m, b in pairs]
            cells.append(_verdict(None if None in found else min(found), strict))
        met = sum(cell.startswith("yes") for cell in cells)
        measured = sum(cell != "not measured" for cell in cells)
        rows.append([label, *cells, f"{met} of {measured}"])
    return (
        "Correctness, LOCUS refined; a cell is the smallest difference over the "
        "sizes n the target covers, each the mean over pools of the paired "
        "difference; *matches* asks it to be >= 0, *beats* > 0.\n\n"
        + _table(["target", *folds, "folds met"], rows)
    )


def in_domain(scores):
    rows = []
    for fold in dict.fromkeys(row["fold"] for row in scores):
        figures = _figures(scores, "in-domain", fold)
        for n in sorted({n for _, n in figures}):
            cells = []
            for metric in (0, 1):
                for method in (FORWARD, ZERO_SHOT):
                    cells.append(
                        _cell([v[metric] for v in figures[method, n].values()])
                    )
            rows.append([fold, n, cells[0], cells[1], cells[2], cells[3]])
    header = [
        "left out",
        "n",
        "correctness, forward",
        "correctness, refined",
        "routing, forward",
        "routing, refined",
    ]
    return (
        "### In domain: the public-pool embedder on the other four benchmarks\n\n"
        + _table(header, rows)
    )


def novelty(records):
    rows = [
        [
            r["fold"],
            r["queries"],
            r["count"],
            f"{r['median']:.2f}",
            f"{r['beyond']:.2f}",
        ]
        for r in records
        if r["kind"] == "novelty"
    ]
    return (
        "### How new the queries look (`query_novelty` of the zero-shot embedder)\n\n"
        + _table(
            ["left out", "queries", "count", "median novelty", "share above 1"], rows
        )
    )


def fits(records):
    rows = [
        [
            f["fold"],
            f["embedder"],
            f["epochs"],
            "cached" if f["seconds"] is None else f"{f['seconds']:.0f} s",
            f["commit"],
        ]
        for f in records
        if f["kind"] == "fit"
    ]
    return "### Fits\n\n" + _table(
        ["fold", "embedder", "epochs", "fit time", "commit"], rows
    )


def page(records):
    """The whole of docs/research/transfer.md below its header."""
    scores = [r for r in records if r["kind"] == "score"]
    return "\n\n".join(
        [
            "### Targets, fold by fold\n\n" + verdict_table(scores),
            *fold_tables(scores),
            differences(scores),
            in_domain(scores),
            novelty(records),
            fits(records),
        ]
    )


def headline(records):
    """Correctness of each approach per fold, before and after, for results.md."""
    scores = [r for r in records if r["kind"] == "score"]
    columns = [
        (FORWARD, "zero-shot, before (forward pass)"),
        (ZERO_SHOT, "zero-shot, after (refined)"),
        *(
            (m, m.removeprefix("LOCUS ").removesuffix(", refined"))
            for m in _fine_tuned(scores)
        ),
        (SCRATCH, f"scratch on {FINETUNE_MODELS}, refined"),
        *((b, b) for b in BASELINES),
    ]
    rows = []
    for fold in dict.fromkeys(row["fold"] for row in scores):
        figures = _figures(scores, "transfer", fold)
        for n in sorted({n for _, n in figures}):
            rows.append(
                [fold, n]
                + [
                    _mean_cell(figures, m, n) if (m, n) in figures else ""
                    for m, _ in columns
                ]
            )
    transfer = _table(["left out", "n", *(name for _, name in columns)], rows)
    small = []
    for fold in dict.fromkeys(row["fold"] for row in scores):
        figures = _figures(scores, "transfer", fold)
        scratch = [
            m
            for m in _methods(figures)
            if m.startswith("LOCUS scratch on") and m.endswith("refined")
        ]
        if len(scratch) < 2:
            continue
        for n in sorted({n for _, n in figures}):
            for passed, label in PASSES:
                row = [
                    _mean_cell(figures, m.replace("refined", passed), n)
                    for m in scratch
                ]
                baselines = [_mean_cell(figures, b, n) for b in BASELINES]
                small.append([fold, n, label, *row, *baselines])
        header = [
            "benchmark",
            "n",
            "LOCUS",
            *(
                re.sub(r"LOCUS scratch on (\d+), refined", r"trained on \1", m)
                for m in scratch
            ),
            *BASELINES,
        ]
    parts = [transfer]
    if small:
        parts.append(_table(header, small))
    return parts


def runs(paths):
    """One line per run: its file, commit and the parameters it was given."""
    lines = []
    for path in paths:
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        fitted = [r for r in records if r["kind"] == "fit"]
        scored = [r for r in records if r["kind"] == "score"]
        folds = " ".join(dict.fromkeys(r["fold"] for r in fitted))
        pools = " ".join(str(p) for p in sorted({r["pool"] for r in scored}))
        options = f"--folds {folds} --pools {pools}"
        if "draws" in scored[0]:
            options += f" --draws {scored[0]['draws']}"
        for name in ("set", "finetune"):
            if fitted[0][name]:
                options += f" --{name} " + " ".join(fitted[0][name])
        if "refine" in scored[0]:
            options += " --refine " + " ".join(f"{v:g}" for v in scored[0]["refine"])
        commits = ", ".join(dict.fromkeys(r["commit"] for r in fitted))
        lines.append(f"- {Path(path).name}: `{options}`, commit {commits}")
    return "\n".join(lines)


def write_docs(records, folder, command, paths):
    """Write docs/research/transfer.md and the transfer section of results.md."""
    folder = Path(folder)
    (folder / "transfer.md").write_text(
        "# Transfer to a benchmark the embedder never saw\n\n"
        f"Written by `{command}`; every figure below comes from the runs of "
        "`python -m research.transfer DATA_FOLDER` with these "
        "options, whose JSON lines are in results/:\n\n"
        + runs(paths)
        + "\n\nProtocol: research/transfer.py's docstring. A cell is the "
        "mean over pools ± their standard deviation.\n\n" + page(records) + "\n"
    )
    transfer, *small = headline(records)
    section = [
        BEGIN,
        "## Transfer to a benchmark the embedder never saw, and small pools",
        "",
        "Correctness accuracy on the held-out queries of a benchmark left out of "
        "training (mean over three pools of 112 models ± sd), from "
        "research/transfer.py; *before* is the forward pass this "
        "library had, *after* adds `refine_steps=50`. Routing, paired "
        "differences, in-domain checks and query novelty: [transfer.md](transfer.md).",
        "",
        transfer,
        "",
        verdict_table([r for r in records if r["kind"] == "score"]),
    ]
    if small:
        section += [
            "",
            "Small pools: LOCUS trained from scratch on k models of one benchmark "
            "only, the rest onboarded, before and after refinement.",
            "",
            small[0],
        ]
    section.append(END)
    results = folder / "results.md"
    text = results.read_text()
    block = "\n".join(section)
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    results.write_text(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", nargs="+", help="JSON lines of research/transfer.py")
    parser.add_argument(
        "--docs", help="folder whose transfer.md and results.md to write"
    )
    arguments = parser.parse_args()
    records = load(arguments.lines)
    if arguments.docs is None:
        print(page(records))
        return
    command = (
        "python -m research.transfer_report "
        + " ".join(arguments.lines)
        + f" --docs {arguments.docs}"
    )
    write_docs(records, arguments.docs, command, arguments.lines)


if __name__ == "__main__":
    main()
