"""The ``trainbook`` command line (also ``python -m toolkit``).

    main.py         the verbs: one per job, each a thin toolkit call, and the parser that names them
    conventions.py  how every verb parses: no abbreviated flags, a verb's own usage and a "did you mean" on a
                    mistake, a one-line description and an example in each --help
    following.py    a run followed in the terminal: progress, the signals that stop it, how it ended
    lifecycle.py    verbs for runs and endpoints started elsewhere: stop, watch, endpoints
    completion.py   the shell completion script, generated from the parser
"""

from toolkit.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
