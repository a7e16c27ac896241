"""`attnlab study SPEC --out OUT` refuses a bad spec value in one line before anything is written.

Each of these once failed only after the study folder was made (a traceback, every run failing,
a report of no cells), or was taken without a word (a seed or reference that meant nothing).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.analysis.retrieval import LOSSES, PROTOCOLS
from attnlab.bench.overhead import measure
from attnlab.data.corpus import NAMED
from attnlab.data.prepare import TOKENIZERS
from attnlab.studies.kinds import KINDS
from attnlab.studies.spec import NAME_MAX, load_spec

LM = """[variants.a]
preset = "shakespeare-char"
[variants.b]
preset = "shakespeare-char"
[[comparisons]]
baseline = "a"
variant = "b"
[scale.ci]
seeds = 1
"""
OVERHEAD = """kind = "overhead"
[params]
layers = 1
[scale.ci]
seeds = 1
params = { widths = [8], batch = 1, block = 4, reps = 1 }
"""
RETRIEVAL = """kind = "retrieval"
[params.protocols]
attnlab = {}
[[params.tables]]
title = "T"
defaults = { methods = ["random"], d = 4, patterns = 2 }
baseline = "a"
cells = [
  { column = "a", args = { sigma = 0.5 }, paper = { random = 50.0 } },
  { column = "b", args = { sigma = 0.8 } },
]
[scale.ci]
seeds = 1
params = { steps = 1, queries = 10 }
"""
KNOWN = ", ".join(inspect.signature(measure).parameters)  # bench overhead's keyword arguments
NAME_RULE = (
    f"must be 1 to {NAME_MAX} letters (a-z, A-Z), digits, '.', '_' or '-', starting with a "
    "letter or digit"
)
SEED_RULE = (
    "train.seed is not read in a study: its runs' seeds come from `seeds = N` (0 .. N-1) or "
    "`--seeds`; leave it out"
)
WIDTHS = "widths must be a non-empty list, each a whole number >= 1"


def _named(name: str) -> tuple[str, str, str]:
    """LM's first variant renamed ``name`` (TOML-quoted)."""
    return LM, "[variants.a]", f"[variants.{json.dumps(name)}]"


CASES = {
    # 1. an unknown key in an overhead study's params: a TypeError traceback
    "overhead-unknown-key": (
        OVERHEAD, "layers = 1", "layers = 1\nbogus = 1", [],
        f"{{f}} params: unknown params key 'bogus' (known: {KNOWN})",
    ),
    "overhead-misspelt-key": (
        OVERHEAD, "reps = 1", "rep = 1", [],
        f"{{f}} scale ci params: unknown params key 'rep'; did you mean 'reps'? (known: {KNOWN})",
    ),
    # 2. overhead values of the wrong type or range
    "overhead-widths-text": (
        OVERHEAD, "widths = [8]", 'widths = "abc"', [],
        f"{{f}} scale ci params: {WIDTHS}, not 'abc'",
    ),
    "overhead-width-zero": (
        OVERHEAD, "widths = [8]", "widths = [8, 0]", [],
        f"{{f}} scale ci params: {WIDTHS}, not [8, 0]",
    ),
    "overhead-no-widths": (
        OVERHEAD, "widths = [8], ", "", [],
        "{f} params at ci: needs widths (in [params] or the scale's params)",
    ),
    "overhead-layers-flag": (
        OVERHEAD, "layers = 1", "layers = true", [],
        "{f} params: layers must be a whole number >= 1, not True",
    ),
    "overhead-width-per-head": (
        OVERHEAD, "widths = [8]", "widths = [10]", [],
        "{f} params at ci: n_embd=10 must be divisible by n_head=4",
    ),
    # 3. retrieval sizes, settings and tables: the folder and a report of no cells were written
    "retrieval-steps": (
        RETRIEVAL, "steps = 1", "steps = -1", [],
        "{f} scale ci params: steps must be a whole number >= 1, not -1",
    ),
    "retrieval-queries": (
        RETRIEVAL, "queries = 10", "queries = 0.5", [],
        "{f} scale ci params: queries must be a whole number >= 1, not 0.5",
    ),
    "retrieval-loss": (
        RETRIEVAL, "attnlab = {}", 'attnlab = { loss = "l2" }', [],
        f"{{f}} protocol attnlab: loss must be one of {', '.join(LOSSES)}, not 'l2'",
    ),
    "retrieval-protocol": (
        RETRIEVAL, "attnlab = {}", "mine = {}", [],
        f"{{f}} params.protocols: unknown protocol 'mine'; choose from {', '.join(PROTOCOLS)}",
    ),
    "retrieval-patterns": (
        RETRIEVAL, "patterns = 2", "patterns = 1", [],
        "{f} table 'T' defaults: patterns must be a whole number >= 2, not 1",
    ),
    "retrieval-sigma": (
        RETRIEVAL, "sigma = 0.5", "sigma = nan", [],
        "{f} table 'T' column 'a' args: sigma must be a finite number > 0, not nan",
    ),
    "retrieval-missing-arg": (
        RETRIEVAL, ", d = 4", "", [],
        "{f} table 'T' column 'a': needs d (in its args or the defaults)",
    ),
    "retrieval-column-twice": (
        RETRIEVAL, 'column = "b"', 'column = "a"', [], "{f} table 'T': column 'a' is listed twice"
    ),
    "retrieval-column-pipe": (
        RETRIEVAL, 'column = "b"', 'column = "b|c"', [],
        "{f} table 'T' cells: column must be a non-empty string without '|' or line breaks, "
        "not 'b|c'",
    ),
    "retrieval-baseline": (
        RETRIEVAL, 'baseline = "a"', 'baseline = "z"', [],
        "{f} table 'T': baseline 'z' is not one of its columns (a, b)",
    ),
    # 4. a data table the data module cannot prepare: refused once the study folder was made
    "data-tokenizer": (
        LM, "seeds = 1", 'seeds = 1\ndata = { tokenizer = "nope" }', [],
        f"{{f}}: scale ci: data: unknown tokenizer 'nope' (expected {', '.join(TOKENIZERS)})",
    ),
    "data-corpus": (
        LM, "seeds = 1", 'seeds = 1\ndata = { corpus = "nope" }', [],
        f"{{f}}: scale ci: data: unknown shipped corpus 'nope' (expected {', '.join(NAMED)})",
    ),
    "data-vocab-type": (
        LM, "seeds = 1", 'seeds = 1\ndata = { tokenizer = "bpe", vocab_size = "x" }', [],
        "{f}: scale ci: data: vocab_size must be a whole number >= 1, not 'x'",
    ),
    "data-key": (
        LM, "seeds = 1", 'seeds = 1\ndata = { tokeniser = "bpe" }', [],
        "{f}: scale ci: data: unknown data key 'tokeniser'; did you mean 'tokenizer'? "
        "(known: corpus, tokenizer, vocab_size)",
    ),
    # 5. variant names: ENAMETOOLONG in every run, or a report table split in two
    "name-too-long": (
        *_named("v" * 300), [],
        f"{{f}}: variant name 'vvvvvvvvvvvvvvvv'... (300 characters) {NAME_RULE}",
    ),
    "name-one-too-long": (
        *_named("v" * (NAME_MAX + 1)), [],
        f"{{f}}: variant name 'vvvvvvvvvvvvvvvv'... ({NAME_MAX + 1} characters) {NAME_RULE}",
    ),
    "name-pipe": (*_named("a|b"), [], f"{{f}}: variant name 'a|b' {NAME_RULE}"),
    "name-newline": (*_named("a\nb"), [], f"{{f}}: variant name 'a\\nb' {NAME_RULE}"),
    "name-leading-dash": (*_named("-a"), [], f"{{f}}: variant name '-a' {NAME_RULE}"),
    # 6. a seed in a train table: silently ignored
    "seed-in-variant": (
        LM, 'preset = "shakespeare-char"\n[variants.b]',
        'preset = "shakespeare-char"\ntrain = { seed = 5 }\n[variants.b]', [],
        f"{{f}} variant a: {SEED_RULE}",
    ),
    "seed-in-scale": (
        LM, "seeds = 1", "seeds = 1\ntrain = { seed = 5 }", [], f"{{f}} scale ci: {SEED_RULE}"
    ),
    "seed-in-scale-variant": (
        LM, "seeds = 1", "seeds = 1\n[scale.ci.variants.b]\ntrain = { seed = 5 }", [],
        f"{{f}} scale ci variant b: {SEED_RULE}",
    ),
    # 7. reference numbers that are not numbers
    "reference-nan": (
        LM, 'preset = "shakespeare-char"\n[variants.b]',
        'preset = "shakespeare-char"\nreference = nan\n[variants.b]', [],
        "{f} variant a: reference must be a finite number, not nan",
    ),
    "reference-t-inf": (
        LM, 'variant = "b"', 'variant = "b"\nreference_t = -inf', [],
        "{f} comparison: reference_t must be a finite number, not -inf",
    ),
    "paper-inf": (
        RETRIEVAL, "random = 50.0", "random = inf", [],
        "{f} table 'T' column 'a' paper: random must be a finite number, not inf",
    ),
    # 8. --variants where the kind trains none: "it has " and nothing
    "variants-retrieval": (
        RETRIEVAL, "", "", ["--variants", "a"],
        "--variants: kind = 'retrieval' studies train no variants; leave it out",
    ),
    "variants-overhead": (
        OVERHEAD, "", "", ["--variants", "a"],
        "--variants: kind = 'overhead' studies train no variants; leave it out",
    ),
    "variants-none-retrieval": (  # `--variants ,` said "choose from " and nothing
        RETRIEVAL, "", "", ["--variants", ","],
        "--variants: kind = 'retrieval' studies train no variants; leave it out",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_bad_spec_value_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, case: str
) -> None:
    base, old, new, args, message = CASES[case]
    assert base.count(old) == 1 or not old, "the case must change the spec once"
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text(base.replace(old, new) if old else base)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec_file), "--preset", "ci", "--out", str(out), *args)
    assert error_line(p, "study") == message.format(f=spec_file)
    assert snapshot(tmp_path) == before
    assert not out.exists()


def test_values_at_the_edge_of_each_rule_are_accepted(tmp_path: Path) -> None:
    """The smallest sizes, a longest variant name, finite references and a data table the data
    module prepares pass both the parser and each kind's check (nothing trains)."""
    longest = "v" * NAME_MAX
    lm = (
        LM.replace("[variants.a]", f"[variants.{longest}]")
        .replace('baseline = "a"', f'baseline = "{longest}"')
        .replace("[variants.b]", '[variants."0b.c_d-e"]\nreference = 0.0')
        .replace('variant = "b"', 'variant = "0b.c_d-e"\nreference_t = -1e300')
        .replace("seeds = 1", 'seeds = 1\ndata = { tokenizer = "bytebpe", vocab_size = 257 }')
        .replace("[scale.ci]", "[scale.ci]\ntrain = { max_iters = 1 }\nmodel = { n_layer = 1 }")
    )
    overhead = OVERHEAD.replace("widths = [8]", "widths = [4, 8]").replace(
        "layers = 1",
        'layers = 1\nwarmup = 0\nn_head = 1\nvocab = 1\nmechanisms = []\ndevice = "auto"',
    )
    retrieval = (
        RETRIEVAL.replace("d = 4", "d = 1")
        .replace("sigma = 0.5", "sigma = 1e-300")
        .replace("random = 50.0", "random = 0")
        .replace("queries = 10", "queries = 1")
        .replace("attnlab = {}", 'attnlab = { loss = "mse", steps = 1 }\nreleased = {}')
    )
    specs = []
    for k, text in enumerate((lm, overhead, retrieval)):
        spec_file = tmp_path / f"edge{k}.toml"
        spec_file.write_text(text)
        specs.append(load_spec(spec_file))
        KINDS[specs[-1].kind].check(specs[-1], "ci")
    assert [s.kind for s in specs] == ["lm", "overhead", "retrieval"]
    assert longest in specs[0].variants and specs[0].variants["0b.c_d-e"].reference == 0.0
    assert [p.is_file() for p in tmp_path.iterdir()] == [True] * 3  # nothing made a folder
