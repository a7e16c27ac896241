"""The Results table (results/README.md), generated from the published studies under results/
and the hand-kept claims file results/claims.toml: every number comes from the studies' data,
every verdict word from ``verdict.verdict``; the claims file holds only what the seeds say.

A claims row names a study and one or more comparisons (``variant - baseline``): a paired
per-seed test on the study's results.csv (language-model studies) or on a retrieval table's
per-seed accuracies, Fisher's exact test on a names analysis's counts, or ``descriptive``
numbers with a short hand-written text. Holm's correction runs within each study (within each
table and protocol of a retrieval study) over the study's own comparisons and every test the
claims file adds on the same data.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from attnlab.errors import AttnlabError
from attnlab.studies import output
from attnlab.studies.report import md_table, p_value
from attnlab.studies.stats import holm, paired_comparison
from attnlab.studies.verdict import KINDS, Verdict, holm_alpha, verdict
from attnlab.train.spec import tomllib

CLAIMS = "claims.toml"
README = "README.md"
MARK = (
    "<!-- written by `attnlab results` from claims.toml and the studies' data: "
    "edit those and run it again, not this file -->"
)
# the budget a claims row's study ran: the claim's own (the seed's, or early training), a
# converged one for a claim about trained models, or short of the trained models it is about
BUDGETS = ("seed", "converged", "short")
TESTED = tuple(k for k in KINDS if k != "descriptive")  # the kinds a [[row.compare]] may be
STILL_FALLING = 0.01  # a run whose val loss fell more than this fraction over its last fifth


@dataclass
class Test:
    """One comparison of a claims row, with what the table prints and what the verdict weighs."""

    label: str
    kind: str
    family: tuple[str, ...]
    n: int
    diff: float = math.nan
    p: float | None = None
    seed_value: float | None = None
    numbers: str = ""
    stat: str = ""
    extra: str = ""
    interval: Callable[[float], tuple[float, float]] | None = None
    p_holm: float | None = None
    family_size: int = 0
    ci: tuple[float, float] = (math.nan, math.nan)

    def test_text(self) -> str:
        """The test, its Holm p over the family, what else it saw, and the Holm interval."""
        if self.p is None:
            return f"{self.label}: {self.stat}"
        low, high = self.ci
        return (
            f"{self.label}: {self.stat}, Holm {p_value(self.p_holm)} over {self.family_size}"
            + (f"; {self.extra}" if self.extra else "")
            + f"; Holm CI {_signed(low, '.4g')} to {_signed(high, '.4g')}"
        )

    def identity(self) -> tuple[Any, ...]:
        """What makes two tests the same test (counted once in their Holm family)."""
        return (*self.family, self.kind, self.label)


@dataclass
class Row:
    """A claims row, its study and its tests."""

    claim: dict[str, Any]
    study: Study
    tests: list[Test] = field(default_factory=list)


def _signed(x: float, fmt: str) -> str:
    return f"{x:+{fmt}}".replace("-", "−")


def _fmt(x: float, fmt: str) -> str:
    return f"{x:{fmt}}".replace("-", "−")


def _need(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise AttnlabError(f"{where}: missing {key!r}")
    return table[key]


class Study:
    """One published study folder: its record, per-seed numbers and own comparisons."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.folder = root / name
        self.losses: dict[str, dict[int, float]] = {}
        self.changes: list[float] = []  # each run's val change over its last fifth, if recorded
        self.runs = 0
        try:
            self.record = json.loads((self.folder / output.STUDY_JSON).read_text())
            self.results = json.loads((self.folder / output.RESULTS_JSON).read_text())
            with (self.folder / output.RESULTS_CSV).open() as f:
                for r in csv.DictReader(f):
                    if r["status"] != "ok" or not r["val_loss"]:
                        continue
                    self.runs += 1
                    loss = float(r["val_loss"])
                    self.losses.setdefault(r["variant"], {})[int(r["seed"])] = loss
                    if r.get("val_change_last20"):
                        self.changes.append(float(r["val_change_last20"]))
        except (OSError, ValueError, KeyError) as e:  # JSONDecodeError is a ValueError
            raise AttnlabError(f"results/{name}: not a readable published study ({e!r})") from e

    def convergence_note(self) -> str:
        """How many of the study's runs were still falling at the end (or that none recorded it)."""
        if not self.changes:
            return "convergence not recorded"
        falling = sum(-c > STILL_FALLING for c in self.changes)
        if not falling:
            return f"every run within {100 * STILL_FALLING:.0f} % over its last fifth"
        return (
            f"{falling} of {self.runs} runs fell more than {100 * STILL_FALLING:.0f} % over "
            "their last fifth"
        )

    def links(self) -> str:
        names = [("report", output.REPORT), ("notes", "NOTES.md")]
        return ", ".join(
            f"[{self.name} {what}]({self.name}/{file})"
            for what, file in names
            if (self.folder / file).is_file()
        )

    # --- paired comparisons of a language-model study ---
    def lm_family(self) -> list[tuple[str, str]]:
        return [(c["variant"], c["baseline"]) for c in self.results["comparisons"]]

    def arm(self, variant: str) -> str:
        if variant not in self.losses:
            raise AttnlabError(f"results/{self.name}: no finished runs of {variant!r}")
        x = np.array(list(self.losses[variant].values()))
        return f"{variant} {x.mean():.4f} ± {x.std(ddof=1):.4f}"

    def lm_test(self, variant: str, baseline: str, seed_value: float | None) -> Test:
        arms = f"{self.arm(variant)} vs {self.arm(baseline)}"  # refuses an arm without runs
        seeds = sorted(set(self.losses[variant]) & set(self.losses[baseline]))
        v = [self.losses[variant][s] for s in seeds]
        b = [self.losses[baseline][s] for s in seeds]
        return paired_test(
            (variant, baseline),
            (self.name,),
            v,
            b,
            seed_value,
            arms=arms,
            fmt=".4f",
            better="lower",
            ppl=True,
        )

    # --- paired comparisons of a retrieval study ---
    def retrieval_table(self, title: str) -> dict[str, Any]:
        for table in self.record.get("tables", []):
            if table["title"].startswith(title):
                return table
        raise AttnlabError(f"results/{self.name}: no table titled {title!r}")

    def accuracy(self, table: dict[str, Any], column: str, protocol: str) -> list[float]:
        for cell in table["cells"]:
            if cell["column"] == column:
                per_seed = cell["protocols"][protocol]["per_seed"]
                (method,) = table["rows"]
                return [s[method] for s in per_seed]
        raise AttnlabError(f"results/{self.name}: {table['title']} has no column {column!r}")

    def retrieval_family(self, title: str, protocol: str) -> list[tuple[str, str]]:
        table = self.retrieval_table(title)
        return [
            (c["column"], c["baseline"])
            for c in table.get("comparisons", [])
            if c["protocol"] == protocol
        ]

    def retrieval_test(
        self, title: str, protocol: str, variant: str, baseline: str, seed_value: float | None
    ) -> Test:
        table = self.retrieval_table(title)
        v, b = (self.accuracy(table, c, protocol) for c in (variant, baseline))

        def arm(name: str, x: list[float]) -> str:
            return f"{name} {np.mean(x):.2f} ± {np.std(x, ddof=1):.2f} %"

        return paired_test(
            (variant, baseline),
            (self.name, title, protocol),
            v,
            b,
            seed_value,
            arms=f"{arm(variant, v)} vs {arm(baseline, b)}",
            fmt=".2f",
            better="higher",
            unit=" points",
        )

    # --- Fisher's exact test of a names analysis ---
    def names_test(self, seed_percent: list[float] | None) -> Test:
        names = self.record.get("analyses", {}).get("names")
        if not names:
            raise AttnlabError(f"results/{self.name}: no names analysis recorded")
        baseline, variant = names["runs"]
        (kb, nb), (kv, nv) = ((s["canonical_headers"], s["headers"]) for s in names["scores"])
        counts = [[kv, nv - kv], [kb, nb - kb]]
        p = float(sps.fisher_exact(counts).pvalue)
        ratio = sps.contingency.odds_ratio(counts)

        def interval(alpha: float) -> tuple[float, float]:
            ci = ratio.confidence_interval(confidence_level=1 - alpha)
            return math.log(ci.low), math.log(ci.high)

        seed_value = None
        if seed_percent is not None:
            pv, pb = (x / 100 for x in seed_percent)
            seed_value = math.log(pv / (1 - pv)) - math.log(pb / (1 - pb))
        return Test(
            label=f"canonical names, {variant} − {baseline} (log odds ratio)",
            kind="fisher",
            family=(self.name,),
            n=1,
            diff=math.log(ratio.statistic),
            p=p,
            seed_value=seed_value,
            numbers=(
                f"seed-{names['seed']} samples against the {names['cast_size']} speakers of the "
                f"training text: {variant} {100 * kv / nv:.1f} % canonical ({kv} of {nv} "
                f"headers), {baseline} {100 * kb / nb:.1f} % ({kb} of {nb}); log odds ratio "
                f"{_signed(math.log(ratio.statistic), '.2f')}"
            ),
            stat=f"Fisher exact p = {p_value(p)}",
            interval=interval,
        )


def paired_test(
    names: tuple[str, str],
    family: tuple[str, ...],
    v: list[float],
    b: list[float],
    seed_value: float | None,
    *,
    arms: str,
    fmt: str,
    better: str,
    unit: str = "",
    ppl: bool = False,
) -> Test:
    """A paired per-seed comparison of ``v`` (the variant of ``names``) against ``b`` (its
    baseline) as a Test; ``better`` says which way the measure improves."""
    c = paired_comparison(v, b)
    n, mean, sd = c["n"], c["mean_diff"], c["sd_diff"]
    tested = math.isfinite(c["p"])
    low, high = c["ci95"]
    numbers = f"{arms}: {_signed(mean, fmt)}{unit}"
    if tested:
        numbers += f" (95 % CI {_signed(low, fmt)} to {_signed(high, fmt)}"
        if ppl:
            lo_pct, hi_pct = c["ppl_ci95_pct"]
            numbers += (
                f"; perplexity {_signed(c['ppl_change_pct'], '.2f')} %, "
                f"CI {_signed(lo_pct, '.2f')} to {_signed(hi_pct, '.2f')} %"
            )
        numbers += ")"
    wins = int(sum((x < y) if better == "lower" else (x > y) for x, y in zip(v, b, strict=True)))
    stat = f"t({n - 1}) = {_fmt(c['t'], '.2f')}, p = {p_value(c['p'])}" if tested else "no test"
    extra = f"{names[0]} {better} on {wins}/{n} seeds" + (
        f"; MDE {c['mde']:{fmt}}" if tested else ""
    )
    return Test(
        label=f"{names[0]} − {names[1]}",
        kind="paired",
        family=family,
        n=n,
        diff=mean,
        p=c["p"] if tested else None,
        seed_value=seed_value,
        numbers=numbers,
        stat=stat,
        extra=extra,
        interval=(lambda alpha: _t_interval(mean, sd, n, alpha)) if tested else None,
    )


def _t_interval(mean: float, sd: float, n: int, alpha: float) -> tuple[float, float]:
    half = float(sps.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def read_claims(root: Path) -> list[dict[str, Any]]:
    """The rows of results/claims.toml, each checked for the keys the table needs."""
    path = root / CLAIMS
    try:
        rows = tomllib.loads(path.read_text()).get("row", [])
    except OSError as e:
        raise AttnlabError(f"cannot read {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise AttnlabError(f"{path} is not valid TOML: {e}") from e
    if not rows:
        raise AttnlabError(f"{path} holds no [[row]]")
    for i, row in enumerate(rows, 1):
        where = f"{path} row {i}"
        for key in ("claim", "seed_number", "study", "budget", "setting"):
            _need(row, key, where)
        if row["budget"] not in BUDGETS:
            raise AttnlabError(
                f"{where}: budget {row['budget']!r} is not one of {', '.join(BUDGETS)}"
            )
        if bool(row.get("compare")) == ("seen" in row):
            raise AttnlabError(f"{where}: give [[row.compare]] comparisons or a descriptive 'seen'")
        for c in row.get("compare", []):
            kind = c.get("kind", "paired")
            if kind not in TESTED:
                raise AttnlabError(
                    f"{where}: comparison kind {kind!r} is not one of {', '.join(TESTED)}"
                )
            for key in ("variant", "baseline") if kind == "paired" else ():
                _need(c, key, where)
    return rows


def _tests(study: Study, row: dict[str, Any]) -> list[Test]:
    """The tests a claims row asks for on its study."""
    tests = []
    claimed = {
        (c["variant"], c["baseline"]): c.get("claimed_diff") for c in study.results["comparisons"]
    }
    for c in row.get("compare", []):
        if c.get("kind") == "fisher":
            tests.append(study.names_test(c.get("seed_percent")))
        elif "table" in c:
            tests.append(
                study.retrieval_test(
                    c["table"],
                    c.get("protocol", "released"),
                    c["variant"],
                    c["baseline"],
                    c.get("seed_value"),
                )
            )
        else:
            pair = (c["variant"], c["baseline"])
            tests.append(study.lm_test(*pair, c.get("seed_value", claimed.get(pair))))
    return tests


def _family_tests(study: Study, family: tuple[str, ...]) -> list[Test]:
    """The study's own comparisons in one Holm family, as Tests."""
    if len(family) == 1:
        return [study.lm_test(v, b, None) for v, b in study.lm_family()]
    _, title, protocol = family
    return [
        study.retrieval_test(title, protocol, v, b, None)
        for v, b in study.retrieval_family(title, protocol)
    ]


def build(root: Path) -> list[Row]:
    """Every claims row with its tests, Holm-corrected within their families, and verdicts."""
    studies: dict[str, Study] = {}
    rows = []
    for claim in read_claims(root):
        name = claim["study"]
        if name not in studies:
            if not (root / name).is_dir():
                raise AttnlabError(f"{root / CLAIMS}: no published study {name!r} under {root}")
            studies[name] = Study(root, name)
        rows.append(Row(claim, studies[name], _tests(studies[name], claim)))
    # Holm: each family holds the study's own comparisons and every test the rows add on it
    families: dict[tuple[str, ...], dict[tuple[Any, ...], float | None]] = {}
    for row in rows:
        for t in row.tests:
            family = families.get(t.family)
            if family is None:
                own = _family_tests(studies[t.family[0]], t.family)
                family = families[t.family] = {o.identity(): o.p for o in own}
            family[t.identity()] = t.p
    adjusted = {
        key: dict(
            zip(
                members, holm([math.nan if p is None else p for p in members.values()]), strict=True
            )
        )
        for key, members in families.items()
    }
    for row in rows:
        for t in row.tests:
            t.p_holm = adjusted[t.family][t.identity()]
            if t.p is not None and t.interval is not None:
                t.ci = t.interval(holm_alpha(t.p, t.p_holm))
                t.family_size = len(families[t.family])
    return rows


def _descriptive_n(row: Row) -> int:
    """The seeds a descriptive row rests on: one for a recorded analysis (each analyses one
    seed's runs), else every seed of the study."""
    name = row.claim.get("analysis")
    if name is None:
        return len(row.study.record["seeds"])
    if name not in row.study.record.get("analyses", {}):
        raise AttnlabError(f"results/{row.study.name}: no {name!r} analysis recorded")
    return 1


def row_verdicts(row: Row) -> list[Verdict]:
    """One verdict per test of the row (one for a descriptive row), with the study's
    convergence disclosed where its runs recorded it."""
    converged = row.claim["budget"] != "short"
    if not row.tests:
        n = _descriptive_n(row)
        return [
            verdict(
                math.nan, (math.nan, math.nan), None, n=n, converged=converged, kind="descriptive"
            )
        ]
    out = []
    for t in row.tests:
        if t.p is None:
            raise AttnlabError(f"{row.claim['study']}: {t.label} has no test to give a verdict on")
        v = verdict(t.diff, t.ci, t.seed_value, n=t.n, converged=converged, kind=t.kind)
        if t.kind == "fisher":  # one model per arm: the test weighs its samples, not training
            v = replace(
                v,
                qualifiers=(
                    *v.qualifiers,
                    "one model per arm: the samples vary, not the training seed",
                ),
            )
        out.append(v)
    return out


def _verdict_cell(row: Row, verdicts: list[Verdict]) -> str:
    """Each test's word in bold, the qualifiers once when all tests share them."""
    shared = len({v.qualifiers for v in verdicts}) == 1
    notes = [row.study.convergence_note()] if row.study.losses else []
    if len(verdicts) == 1:
        (v,) = verdicts
        return f"**{v.word}** ({'; '.join((*v.qualifiers, *notes))})"
    parts = [
        f"{t.label}: **{v.word}**" + ("" if shared else f" ({'; '.join(v.qualifiers)})")
        for t, v in zip(row.tests, verdicts, strict=True)
    ]
    tail = [*verdicts[0].qualifiers, *notes] if shared else notes
    return "; ".join(parts) + (f" ({'; '.join(tail)})" if tail else "")


def _cells(row: Row) -> list[str]:
    claim = row.claim
    links = row.study.links()
    if row.tests:
        numbers = "; ".join(t.numbers for t in row.tests)
        tests = "; ".join(t.test_text() for t in row.tests)
        n = " / ".join(dict.fromkeys(str(t.n) for t in row.tests))
    else:
        numbers, tests, n = claim["seen"], "descriptive", str(_descriptive_n(row))
    seen = f"{claim['setting']}: {numbers}" + (f" ({links})" if links else "")
    verdicts = _verdict_cell(row, row_verdicts(row))
    return [claim["claim"], claim["seed_number"], seen, n, tests, verdicts]


def render(root: Path) -> str:
    """The whole of results/README.md."""
    rows = build(root)
    header = [
        "seed: claim",
        "seed's number",
        "attnlab (mean ± std over seeds)",
        "n",
        "test",
        "verdict",
    ]
    return "\n".join(
        [
            MARK,
            "",
            "# Results: do the seeds' claims hold?",
            "",
            "Written by `attnlab results` from the published studies in this folder (their "
            f"`{output.RESULTS_CSV}` and `{output.STUDY_JSON}`) and the seeds' claims in "
            f"[{CLAIMS}]({CLAIMS}); `attnlab results --check` fails when this file differs from "
            "what the command writes. The verdict words come from one rule, given as a table in "
            "[docs/verdicts.md](../docs/verdicts.md): a paired difference is always variant − "
            "baseline in its own units (validation loss in nats, where lower is better; retrieval "
            "accuracy in points, where higher is better; the log odds ratio of two proportions), "
            "and the seed's value in the same units. Holm's correction runs within each study "
            "(within each table and protocol of a retrieval study) over its own comparisons and "
            "the ones this table adds on the same runs; the Holm CI is the interval at the level "
            "the correction spent on the comparison (α · p / p Holm), the interval the verdict "
            "weighs. Every study here trained one model size, and a verdict on fewer than 5 "
            "seeds says so.",
            "",
            *md_table(header, [_cells(row) for row in rows]),
            "",
        ]
    )


def write(root: Path) -> Path:
    """Write results/README.md (temp then rename); refuse to replace one attnlab did not write."""
    path = root / README
    text = render(root)
    if path.exists() and not path.read_text().startswith(MARK):
        raise AttnlabError(f"{path} was not written by `attnlab results`; move it away first")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def check(root: Path) -> None:
    """Raise when results/README.md differs from what ``render`` writes."""
    path = root / README
    if not path.is_file() or path.read_text() != render(root):
        raise AttnlabError(
            f"{path} differs from what `attnlab results` writes: run `attnlab results`"
        )
