"""``python -m hvdprof ...`` behaves exactly like the ``hvdprof`` console command."""

from hvdprof.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
