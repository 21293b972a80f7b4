"""The ``dashboard`` and ``report`` subcommands and ``run --dashboard``, behind the CLI.

:mod:`hvdprof.cli` only registers the arguments; the work is here, imported when one of
these commands runs, so ``hvdprof run`` works without the ``dashboard`` extra installed.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from typing import Any

from hvdprof.common.wakeup import Wakeup
from hvdprof.errors import HvdprofError


def _require_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise HvdprofError(
            f"the dashboard needs {exc.name}: pip install 'hvdprof[dashboard]'"
        ) from None


def add_dashboard_parser(commands: Any) -> None:
    """``hvdprof dashboard DIR [--host H] [--port P] [--no-browser] [--token T]``."""
    from hvdprof.dashboard.settings import DEFAULT_HOST, DEFAULT_PORT

    parser = commands.add_parser(
        "dashboard",
        help="serve the timelines under DIR in the browser (live while a job writes)",
        description="Serve the runs under DIR (timeline directories or trace files: hvdprof, "
        "Horovod, or torch.profiler traces of any PyTorch distributed job) as a dashboard. "
        "Read-only; loopback only unless --token is given.",
    )
    parser.add_argument(
        "directory", metavar="DIR", help="a timeline directory, or one holding several"
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument(
        "--token", help="access token, required to listen on a non-loopback address"
    )
    parser.set_defaults(handler=cmd_dashboard)


def add_report_parser(commands: Any) -> None:
    """``hvdprof report DIR -o report.html``."""
    parser = commands.add_parser(
        "report",
        help="write the dashboard's charts for DIR into one self-contained HTML file",
        description="Write one HTML file (Plotly inlined, opens offline) with the dashboard's "
        "charts for the run in DIR.",
    )
    parser.add_argument(
        "directory", metavar="DIR", help="a timeline directory or trace file's folder"
    )
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="HTML file to write")
    parser.add_argument(
        "--run", default=None, help="which run under DIR (default: the first found)"
    )
    parser.set_defaults(handler=cmd_report)


def add_run_option(run_parser: argparse.ArgumentParser) -> None:
    """``hvdprof run ... --timeline DIR --dashboard``."""
    run_parser.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the timeline in a dashboard beside the job (needs --timeline); prints its URL",
    )
    run_parser.add_argument(
        "--dashboard-exit",
        action="store_true",
        help="stop the dashboard when the job ends (default: it keeps serving the finished "
        "run until Ctrl+C)",
    )
    run_parser.add_argument(
        "--dashboard-port",
        type=int,
        default=0,
        metavar="PORT",
        help="its port (default: any free port)",
    )


def cmd_dashboard(args: argparse.Namespace) -> int:
    from hvdprof.dashboard.server import bind, serve, start_reading
    from hvdprof.dashboard.settings import DashboardSettings

    settings = DashboardSettings(args.directory, host=args.host, port=args.port, token=args.token)
    sock = bind(settings)  # a taken port fails before anything is read
    catalog = start_reading(settings)  # parses while the web stack below is imported
    _require_extra()
    return serve(settings, open_browser=not args.no_browser, sock=sock, catalog=catalog)


def cmd_report(args: argparse.Namespace) -> int:
    _require_extra()
    from hvdprof.dashboard.report import write_report

    written = write_report(args.directory, args.output, run_id=args.run)
    path = written.path
    print(f"hvdprof report: wrote {path} ({os.path.getsize(path):,} bytes); it opens offline")
    if written.binned:
        print(
            "hvdprof report: timeline views held as time bins (zooming in the file magnifies "
            "them; `hvdprof dashboard` shows single slices):"
        )
        for line in written.binned:
            print(f"  {line}")
    return 0


def launch_with_dashboard(args: argparse.Namespace, launch: Callable[[], int]) -> int:
    """Run ``launch()`` with a dashboard on ``args.timeline`` serving beside it."""
    if not getattr(args, "dashboard", False):
        return launch()
    if args.timeline is None:
        raise HvdprofError("run: --dashboard needs --timeline DIR (the directory it shows)")
    _require_extra()
    from hvdprof.dashboard.server import DashboardThread
    from hvdprof.dashboard.settings import DashboardSettings

    directory = os.path.abspath(args.timeline)
    os.makedirs(directory, exist_ok=True)
    dashboard = DashboardThread(DashboardSettings(directory, port=args.dashboard_port)).start()
    print(f"hvdprof dashboard: {dashboard.url} (live while the job runs)", flush=True)
    code: int | None = None
    try:
        code = launch()
        stopped = code in _STOPPED_BY_SIGNAL  # Ctrl+C or SIGTERM stopped the job: stop too
        if not stopped and not getattr(args, "dashboard_exit", False):
            print(
                f"hvdprof dashboard: the job ended (exit code {code}); still serving the "
                f"finished run at {dashboard.url} (Ctrl+C to stop)",
                flush=True,
            )
            _wait_for_stop()
        return code
    finally:
        dashboard.stop()
        again = f"`hvdprof dashboard {args.timeline}` serves it again"
        print(f"hvdprof dashboard: stopped; {again}", flush=True)


#: Exit codes of a launcher stopped by Ctrl+C or SIGTERM (``128 + signal``).
_STOPPED_BY_SIGNAL = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def _wait_for_stop() -> None:
    """Block until Ctrl+C, SIGTERM or SIGHUP (the terminal closing). SIGINT gets a handler
    too: a launcher started in the background of a script inherits it ignored."""
    stopped: list[int] = []
    wakeup = Wakeup()  # not a threading.Event: its set() from a handler can deadlock

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        wakeup.ring()

    handled = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    previous = {}
    for signum in handled:
        previous[signum] = signal.signal(signum, stop)
    try:
        while not stopped:
            wakeup.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        wakeup.close()
