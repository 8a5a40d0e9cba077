"""The DeepSpeed launcher's wait between looks at its ranks (toolkit.runs.launchers.ChildWatch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from toolkit.runs.launchers import ChildWatch

LONG_S = 60  # what the wait may take at most; every case below must end long before


def test_the_wait_ends_when_a_child_ends_not_at_its_timeout():
    child = subprocess.Popen(["sleep", "0.2"])
    started = time.monotonic()
    ChildWatch().sleep(LONG_S)
    waited = time.monotonic() - started
    assert child.poll() is not None, "the wait ended before the child did"
    assert waited < LONG_S / 2, f"waited {waited:.1f} s for a child that ended after 0.2 s"


def test_the_wait_ends_at_once_for_a_child_that_has_ended_but_was_not_reaped():
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it has ended; the launcher has not looked yet
    started = time.monotonic()
    ChildWatch().sleep(LONG_S)
    assert time.monotonic() - started < LONG_S / 2
    assert child.poll() == 0


def test_with_no_child_left_there_is_nothing_to_wait_for():
    # in a process of its own: a pytest worker may hold servers that other tests started
    waited = subprocess.run([sys.executable, "-c", "import time; from toolkit.runs.launchers import ChildWatch; "
                             f"started = time.monotonic(); ChildWatch().sleep({LONG_S}); "
                             "print(time.monotonic() - started)"], capture_output=True, text=True, check=True)
    assert float(waited.stdout) < LONG_S / 2


def test_the_rest_is_the_time_module():
    assert ChildWatch().strftime("%Y", time.gmtime(0)) == "1970"
    assert ChildWatch().localtime is time.localtime
