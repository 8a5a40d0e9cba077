"""``trainbook evaluate RUN_DIR``: the run's newest checkpoint against the weights it started from, on its held-out
data: the loss before and after, and a few held-out prompts answered by both."""

from __future__ import annotations

from toolkit.cli.common import add_json, add_trust_run, print_json
from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    evaluate = add_verb(
        verbs,
        "evaluate",
        "a fine-tune's held-out loss before and after, and held-out prompts answered by the starting weights and by "
        "the newest checkpoint",
        ["trainbook evaluate RUN_DIR", "trainbook evaluate RUN_DIR --examples 5 --max-new-tokens 64"],
    )
    evaluate.add_argument("run_dir", help="a run with at least one valid checkpoint")
    evaluate.add_argument(
        "--examples", type=int, default=3, help="held-out prompts to answer (0: scores only; default 3)"
    )
    evaluate.add_argument("--max-new-tokens", type=int, default=48, help="longest answer, in tokens (default 48)")
    add_trust_run(evaluate)
    add_json(evaluate, "the scores and the answers")
    evaluate.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args) -> int:
    from toolkit.report.evaluation import evaluate_run

    result = evaluate_run(
        args.run_dir, examples=args.examples, max_new_tokens=args.max_new_tokens, trust_run=args.trust_run
    )
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.text())
    return 0
