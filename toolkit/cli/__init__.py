"""The ``trainbook`` command line (also ``python -m toolkit``).

main.py         the dispatcher: the top-level parser, each verb module's verbs in --help's order, the exit codes
<verb>.py       a verb's parser (help, examples, arguments) and its command: train, resume, checkpoints, advise,
                data (its sub-verbs in a registry), runs, tensorboard, doctor, estimate, scale, export, models,
                config, workshop
lifecycle.py    verbs for a run started elsewhere: stop, watch, kill
serve.py        the local endpoint: serve, and endpoints (those running, stop one)
completion.py   the completion verb: the shell completion script, generated from the parser
common.py       what several verbs share: --workspace, --json, --set, --trust-run, --max-restarts, overrides
conventions.py  how every verb parses: no abbreviated flags, a verb's own usage and a "did you mean" on a
                mistake, a one-line description and an example in each --help
following.py    a run followed in the terminal: progress, the signals that stop it, how it ended
"""

from toolkit.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
