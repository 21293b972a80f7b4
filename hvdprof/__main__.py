"""``python -m hvdprof ...`` behaves exactly like the ``hvdprof`` console command."""

# First of all, `hvdprof run` holds SIGUSR1 instead of dying of it (hvdprof/launch/stack_requests.py).
import sys

from hvdprof.launch import stack_requests

stack_requests.hold_for(sys.argv[1] if len(sys.argv) > 1 else None)

# Then, so that a folder named hvdprof in the current directory, which Python takes for
# the package under `python -m`, is noticed and repaired (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

from hvdprof.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
