"""The trace layer: every trace format's files into one format-neutral :class:`Run`.

Below the analyses and beside :mod:`hvdprof.common` (the timeline's writer reads its file
names and manifest schema from :mod:`hvdprof.trace.manifest`), so that reading lives in
one place, as HTA keeps parsing in ``trace_parser.py`` and its analyzers never see the
file format:

- :mod:`~hvdprof.trace.model`: the columnar run, its typed tables (slices, readiness
  marks, GPU activity in :mod:`~hvdprof.trace.gpu`, steps, user ranges) and its
  :class:`~hvdprof.trace.model.Capabilities`, which analyses ask instead of the format;
- :mod:`~hvdprof.trace.formats`: the registry; one module per format
  (:mod:`~hvdprof.trace.hvdprof_reader`, :mod:`~hvdprof.trace.kineto_format`,
  :mod:`~hvdprof.trace.horovod_format`), each read through the same
  :class:`~hvdprof.trace.files.FileReader` into :class:`~hvdprof.trace.columns.Columns`;
- :mod:`~hvdprof.trace.loader`: ``load_run`` (discovery, cache, worker processes, refresh);
- :mod:`~hvdprof.trace.chrome_json`: Chrome-trace JSON as whole events, for merging.

``tests/test_layering.py`` holds it there: it imports no analysis, dashboard, runtime or
timeline module. Importing this package imports nothing (the renderer process reads the
manifest's names without numpy).
"""
