"""``python -m simlib`` and the ``simlib`` console script: see :mod:`simlib.cli`."""
import sys


def main() -> int:
    """Run the command line; Ctrl-C at any moment, imports included, is one line and status 130."""
    try:
        from simlib.cli import main as cli_main

        rc = cli_main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.unraisablehook = lambda unraisable: None  # leaving because of this Ctrl-C (see cli.interrupted)
        rc = 130
    if rc == 130:
        _exit_interrupted()
    return rc


def _exit_interrupted() -> None:
    """Exit with status 130 after the usual clean-up.

    NOTE: a KeyboardInterrupt that reached Python code run by ``eval`` or an import leaves CPython
    believing it went unhandled, and the interpreter then kills itself with SIGINT at exit
    (status -2) even though it was caught. Running the exit handlers and leaving with os._exit
    keeps the promised status.
    """
    import atexit
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
