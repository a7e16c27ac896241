"""`attnlab retrieval`: the synthetic pattern-retrieval task (paper Tables 2, 5, 6)."""

from __future__ import annotations

import argparse
import json

from attnlab.analysis.retrieval_options import DEFAULTS, LOSSES, METHODS, PROTOCOLS, UNTRAINED


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "retrieval", help="accuracy of attention variants on synthetic noisy pattern retrieval"
    )
    p.add_argument("--d", type=int, default=64, help="pattern dimension (default 64)")
    p.add_argument("--patterns", type=int, default=16, help="number K of stored patterns")
    p.add_argument("--sigma", type=float, default=0.5, help="query noise standard deviation")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated methods, of {', '.join(METHODS)}",
    )
    p.add_argument(
        "--rounds", type=int, default=DEFAULTS["rounds"], help="boosting rounds M (1 = one-step)"
    )
    p.add_argument(
        "--gate",
        default=DEFAULTS["gate"],
        help="boosting gate: a choice of the model field boost_gate (attnlab presets --fields)",
    )
    p.add_argument(
        "--protocol",
        default=DEFAULTS["protocol"],
        choices=PROTOCOLS,
        help="released: the authors' released scripts (one global random stream, best of "
        "evaluations every 50 steps); attnlab: separate streams, one fixed evaluation set",
    )
    p.add_argument(
        "--loss",
        choices=LOSSES,
        help="training loss (default: the protocol's own: cos-ce-weights, i.e. the released "
        "cross-entropy on softmax weights, for released; cos-ce for attnlab)",
    )
    p.add_argument("--queries", type=int, default=DEFAULTS["queries"], help="evaluation queries")
    p.add_argument(
        "--steps", type=int, default=DEFAULTS["steps"], help="training steps (batches of 512)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis.retrieval import run_retrieval, training_loss

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    results = run_retrieval(
        args.d,
        args.patterns,
        args.sigma,
        methods,
        rounds=args.rounds,
        gate=args.gate,
        queries=args.queries,
        steps=args.steps,
        seed=args.seed,
        loss=args.loss,
        protocol=args.protocol,
    )
    settings = {
        "d": args.d,
        "patterns": args.patterns,
        "sigma": args.sigma,
        "methods": methods,
        "rounds": args.rounds,
        "gate": args.gate,
        "protocol": args.protocol,
        # what each trained method's loss was (the protocol's own unless --loss chose one)
        "loss": {
            m: training_loss(args.protocol, m, args.loss) for m in methods if m not in UNTRAINED
        },
        "queries": args.queries,
        "steps": args.steps,
        "seed": args.seed,
    }
    if args.json:
        accuracy = {k: round(v, 2) for k, v in results.items()}
        print(json.dumps({"settings": settings, "accuracy": accuracy}))
        return 0
    shown = {k: v for k, v in settings.items() if k not in ("methods", "loss")}
    print("retrieval " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    width = max(len(m) for m in results)
    print(f"{'method':<{width}}  {'loss':<14}  acc %")
    for method, acc in results.items():
        print(f"{method:<{width}}  {settings['loss'].get(method, '-'):<14}  {acc:5.1f}")
    return 0
