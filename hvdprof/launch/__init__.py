"""Starting a job's ranks: every launcher hvdprof has, in one package.

* :mod:`~hvdprof.launch.local_job`: ``hvdprof run -np N``, N ranks on this host;
* :mod:`~hvdprof.launch.elastic_driver`: the membership of an elastic job, one generation
  at a time, whatever starts its workers; :mod:`~hvdprof.launch.elastic_local` drives
  local processes with it (``hvdprof run --min-np``), ``hvdprof.ray.elastic`` Ray actors;
* :mod:`~hvdprof.launch.mpirun`: ``hvdprof run -H``, a multi-host job handed to mpirun;
* :mod:`~hvdprof.launch.processes`, :mod:`~hvdprof.launch.output` and
  :mod:`~hvdprof.launch.signal_trap`: a started rank, its output lines and the launcher's
  signals, shared by the launchers above;
* :mod:`~hvdprof.launch.stack_requests` and :mod:`~hvdprof.launch.stack_target`:
  ``hvdprof stacks``, a SIGUSR1 held from the launcher's first statement and the processes
  it may be sent to.

This package sits above ``runtime`` (it reads the thread defaults and the elastic keys)
and below the CLI and the Ray and Spark front ends. Its ``__init__`` imports nothing: the
console script imports :mod:`~hvdprof.launch.stack_requests` before anything else, in the
milliseconds where an early SIGUSR1 would still end it.
"""
