"""`attnlab retrieval`: the synthetic pattern-retrieval task (paper Tables 2, 5, 6)."""

from __future__ import annotations

import argparse
import json

DEFAULT_METHODS = "random,bayes,one-step,converged-backprop,converged-deq,boosted"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "retrieval", help="accuracy of attention variants on synthetic noisy pattern retrieval"
    )
    p.add_argument("--d", type=int, default=64, help="pattern dimension (default 64)")
    p.add_argument("--patterns", type=int, default=16, help="number K of stored patterns")
    p.add_argument("--sigma", type=float, default=0.5, help="query noise standard deviation")
    p.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated methods")
    p.add_argument("--rounds", type=int, default=2, help="boosting rounds M (1 = one-step)")
    p.add_argument("--gate", default="mlp", help="boosting gate: none, scalar, linear, mlp")
    p.add_argument(
        "--protocol",
        default="released",
        choices=("released", "attnlab"),
        help="released: the authors' released scripts (one global random stream, best of "
        "evaluations every 50 steps); attnlab: separate streams, one fixed evaluation set",
    )
    p.add_argument(
        "--loss",
        choices=("cos-ce", "cos-ce-weights", "cos", "mse"),
        help="training loss (default: the protocol's own: cos-ce-weights, i.e. the released "
        "cross-entropy on softmax weights, for released; cos-ce for attnlab)",
    )
    p.add_argument("--queries", type=int, default=5000, help="evaluation queries")
    p.add_argument("--steps", type=int, default=150, help="training steps (batches of 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis.retrieval import UNTRAINED, run_retrieval, training_loss

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
