"""``python -m hvdprof ...`` behaves exactly like the ``hvdprof`` console command."""

# First, so that a folder named hvdprof in the current directory, which Python takes for
# the package under `python -m`, is noticed and repaired (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

from hvdprof.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
