"""A process's start-up without the cyclic garbage collector walking what the start-up builds.

Importing torch (and torch._dynamo, which torch.optim imports when the first optimizer is made) creates hundreds of
thousands of objects that live as long as the process and leave almost no garbage. CPython 3.11's collector walks
them again and again while they are created (each burst of allocations triggers a pass), and walks them all again
in the collections of interpreter shutdown: for a short run that is a large part of a rank's life, and it is paid
again at every restart. ``long_lived()`` holds the collector off while a process imports and builds, then freezes
what was built (``gc.freeze``: moved to a generation no collection visits), so collections during training and at
exit only see what came after; ``command_process()`` does less of the same for a command that may run on (the CLI, a
job's node). bench/bench_startup.py measures a rank's start-up with and without.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Build the process's long-lived state (imports, model, engine) in the body. The few reference cycles the body
    drops are kept with it, not collected: the price of never walking the rest."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


# A command's collector: a pass every this many new container objects, not CPython's 700, so that loading torch or
# transformers (hundreds of thousands of objects that stay) triggers few passes; garbage is still collected, in
# larger batches, so a command that runs for days (`train` following its run) stays bounded.
COMMAND_THRESHOLDS = (10_000, 50, 100)


def command_process() -> None:
    """For a command's process (the CLI, a job's node): fewer collections while it loads (COMMAND_THRESHOLDS), and
    none in interpreter shutdown, whose memory the operating system frees anyway. The exit handler is registered
    before the command runs, so it runs after every handler the command registers; files and servers are closed by
    the code that opened them, not by the collector."""
    gc.set_threshold(*COMMAND_THRESHOLDS)
    atexit.unregister(gc.freeze)  # once, however often a process calls it (tests call the CLI's main in process)
    atexit.register(gc.freeze)
