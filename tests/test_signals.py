"""simlib.parallel.signals.held under thousands of real Ctrl-Cs: the process's handlers always come back.

A SIGINT that lands while ``held`` restores the handlers raises KeyboardInterrupt there; before the
fix, SIGTERM's handler stayed on ``_note`` and every later SIGTERM of that process was silently
lost (a run that then got SIGTERM went on for ever). Now a signal that reaches such a leftover is
delivered to the real handler.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# The child loops on `with held(): pass` and answers every KeyboardInterrupt with one byte; the test
# sends the next SIGINT only after that byte, so no Ctrl-C lands outside the loop's `try`.
CHILD = r"""
import os, select, signal, sys
from simlib.parallel.signals import held

answer = True  # the first answer says it is ready
while True:
    try:  # the answer is written inside the try: the next Ctrl-C, sent on it, lands here too
        if answer:
            answer = False
            os.write(1, b"k")
        while not select.select([sys.stdin], [], [], 0)[0]:
            with held():
                pass
        break
    except KeyboardInterrupt:
        answer = True
try:  # the storm is over: one Ctrl-C and one SIGTERM, each must reach its real handler
    signal.raise_signal(signal.SIGINT)
    os.write(1, b"SIGINT was lost;")
except KeyboardInterrupt:
    os.write(1, b"interrupted;")
signal.raise_signal(signal.SIGTERM)  # the default action: this process ends here
os.write(1, b"SIGTERM was lost")
"""


def test_no_signal_is_lost_whatever_ctrl_c_interrupts_in_held():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.read(1) == b"k"
        sent = 0
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            os.kill(child.pid, signal.SIGINT)
            sent += 1
            assert child.stdout.read(1) == b"k", "the child ended: a Ctrl-C escaped held()"
        child.stdin.write(b"stop\n")
        child.stdin.flush()
        out = child.stdout.read()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert sent > 500, f"only {sent} Ctrl-Cs in 3 s: the test did not test"
    assert out == b"interrupted;", out
    assert child.returncode == -signal.SIGTERM, (child.returncode, out)
