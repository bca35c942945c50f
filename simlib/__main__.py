"""``python -m simlib`` and the ``simlib`` console script: see :mod:`simlib.cli`."""
import sys


def main() -> int:
    """Run the command line; Ctrl-C while it is still importing is one line and status 130 too."""
    try:
        from simlib.cli import interrupted
        from simlib.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
