"""``python -m hvdprof ...`` behaves exactly like the ``hvdprof`` console command."""

# First, so that a folder named hvdprof in the current directory, which Python takes for
# the package under `python -m`, is noticed and repaired (hvdprof/shadowing.py).
import hvdprof.errors  # noqa: F401
from hvdprof.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
