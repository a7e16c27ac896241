"""`attnlab analyze names RUN [RUN_B]`: do generated speaker names belong to the real cast?

The seed's name-generation test: sample long texts, pull out every speaker header, and count
how many name a speaker of the training text. Samples are drawn in cached segments: whenever
the context fills the block, the cache is primed again with the last half block, so every
token sees at least block_size / 2 tokens of context at KV-cache speed (``exact_window``
recomputes nanoGPT's full sliding window at every step instead, block_size / 2 times the work).
Same seed, same runs, same device: the same samples and the same report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("names", help="speaker names in generated text vs the training cast")
    p.add_argument("run", metavar="RUN")
    p.add_argument("run_b", metavar="RUN_B", nargs="?", help="a second run, reported side by side")
    p.add_argument("--samples", type=int, default=30, help="samples per run (default 30)")
    p.add_argument("--length", type=int, default=2000, help="tokens per sample (default 2000)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--data", help="prepared data folder for the cast (default: the run's own data)")
    p.add_argument(
        "--exact-window",
        action="store_true",
        help="recompute the full sliding window every step (nanoGPT's sampling, slow)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def sample_texts(
    model,
    tokenizer,
    samples: int,
    length: int,
    seed: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    prompt: str = "\n",
    exact_window: bool = False,
) -> list[str]:
    """``samples`` texts of ``length`` new tokens after ``prompt``, drawn as one seeded batch."""
    import torch

    from attnlab.model.generation import generate

    _check_sizes(samples, length)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    opts = dict(temperature=temperature, top_k=top_k, generator=gen)
    out = torch.tensor([tokenizer.encode(prompt)] * samples, dtype=torch.long, device=device)
    start = out.size(1)
    if exact_window:
        out = generate(model, out, length, **opts)
    block, keep = model.config.block_size, max(1, model.config.block_size // 2)
    while out.size(1) - start < length:  # cached segments, each primed with the last half block
        context = out[:, -keep:]
        new = min(length - (out.size(1) - start), block - context.size(1))
        out = torch.cat([out, generate(model, context, new, **opts)[:, context.size(1) :]], dim=1)
    return [tokenizer.decode(row) for row in out.tolist()]


def _check_sizes(samples: int, length: int) -> None:
    from attnlab.errors import AttnlabError

    if samples < 1 or length < 1:
        raise AttnlabError(f"--samples and --length must be >= 1, got {samples} and {length}")


def training_cast(data: str | Path | None) -> tuple[set[str], str, str]:
    """(canonical speaker names, header style, where they came from) of a data folder's train split.

    ``None`` is the embedded corpus, read directly (no prepared folder needed).
    """
    from attnlab.errors import AttnlabError
    from attnlab.eval.names import canonical_speakers

    if data is None:
        from attnlab.data.corpus import load_corpus

        text, source = load_corpus().train_text, "the embedded corpus"
    else:
        from attnlab.data.prepare import load_dataset
        from attnlab.eval.per_position import token_pieces

        dataset = load_dataset(data)
        if dataset.tokenizer.kind != "char":
            raise AttnlabError(
                f"{data}: the name test needs a char tokenizer (bpe drops the newlines)"
            )
        text, source = "".join(token_pieces(dataset.tokenizer, dataset.train)), str(dataset.dir)
    names, style = canonical_speakers(text)
    if not names:
        raise AttnlabError(
            f"no speaker headers (NAME. or Name: lines) in the training text of {source}"
        )
    return names, style, source


def name_test(
    runs: list[str | Path],
    samples: int = 30,
    length: int = 2000,
    seed: int = 1337,
    temperature: float = 0.8,
    top_k: int | None = None,
    data: str | Path | None = None,
    exact_window: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """The name test for each run (same seed for all): the cast and one score per run."""
    from attnlab import from_pretrained
    from attnlab.commands.eval import run_data_dir
    from attnlab.errors import AttnlabError
    from attnlab.eval.names import score_names

    _check_sizes(samples, length)
    data_dirs = {str(run): data or run_data_dir(str(run)) for run in runs}
    folders = {str(Path(d).resolve()) if d else None for d in data_dirs.values()}
    if len(folders) > 1:
        raise AttnlabError(
            f"the runs were trained on different data ({', '.join(map(str, folders))}); pass --data"
        )
    cast, style, source = training_cast(next(iter(data_dirs.values())))
    report: dict[str, Any] = {
        "samples": samples,
        "length": length,
        "seed": seed,
        "temperature": temperature,
        "top_k": top_k,
        "exact_window": exact_window,
        "style": style,
        "cast_source": source,
        "cast_size": len(cast),
        "runs": {},
    }
    for run in runs:
        model, tokenizer = from_pretrained(run, device=device)
        if tokenizer is None:
            raise AttnlabError(f"{run} has no tokenizer.json; cannot decode samples")
        texts = sample_texts(
            model, tokenizer, samples, length, seed, temperature, top_k, exact_window=exact_window
        )
        report["runs"][str(run)] = score_names(texts, cast, style)
    return report


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_report(report: dict[str, Any]) -> None:
    runs = report["runs"]
    print(
        f"name test: {report['samples']} samples x {report['length']} tokens, temperature "
        f"{report['temperature']}, seed {report['seed']}; cast of {report['cast_size']} speakers "
        f"({report['style']} headers) from {report['cast_source']}"
    )
    rows = [
        ("headers found", "headers"),
        ("canonical headers", "canonical_headers"),
        ("fraction canonical", "fraction_canonical"),
        ("distinct names", "distinct_names"),
        ("distinct canonical", "distinct_canonical"),
    ]
    width = max(12, *(len(Path(r).name) for r in runs))
    print(" " * 20 + "".join(f"{Path(r).name:>{width + 2}}" for r in runs))
    for label, key in rows:
        cells = [
            _percent(s[key]) if key == "fraction_canonical" else str(s[key]) for s in runs.values()
        ]
        print(f"{label:<20}" + "".join(f"{c:>{width + 2}}" for c in cells))
    for run, score in runs.items():
        print(
            f"\n{Path(run).name}: most common {', '.join(f'{n} ({c})' for n, c in score['most_common']) or '-'}"
        )
        print(
            f"{Path(run).name}: invented {', '.join(f'{n} ({c})' for n, c in score['invented']) or '-'}"
        )


def run(args: argparse.Namespace) -> int:
    from attnlab.device import resolve_device

    runs = [args.run] + ([args.run_b] if args.run_b else [])
    report = name_test(
        runs,
        args.samples,
        args.length,
        args.seed,
        args.temperature,
        args.top_k,
        args.data,
        args.exact_window,
        str(resolve_device(args.device)),
    )
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0
