"""The dashboard: a FastAPI app and a static Plotly page over :mod:`hvdprof.analysis`.

* :mod:`.settings` what a server serves and how (no web imports: the CLI reads it);
* :mod:`.app` ``create_app(settings)``: routers, token check, error mapping, watcher;
* :mod:`.catalog` the runs under the served directory; :mod:`.paths` keeps it inside;
* :mod:`.service` one call into the analysis library per endpoint, failures as notices;
* :mod:`.live` the change feed behind ``/api/events`` (server-sent events);
* :mod:`.server` serving in the foreground or beside a job; :mod:`.report` the
  self-contained HTML report; :mod:`.commands` the CLI subcommands.

The page (``web/``) is a client of the JSON API and nothing more; the dashboard computes
nothing itself. Importing this package imports no web framework.
"""

# First: a folder named hvdprof that hides the installed package is noticed and undone
# before anything reads the package itself (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()
