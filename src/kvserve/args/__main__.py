"""``python -m kvserve.args --write-compat docs/compat.md`` (or ``--print-compat``)."""

from kvserve.args.render import main

if __name__ == "__main__":
    raise SystemExit(main())
