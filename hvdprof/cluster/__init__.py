"""What every job whose ranks a cluster engine places (Ray actors, Spark tasks) shares.

The engines differ in how they start a rank and how they learn it died; they agree on
the rest, kept here once: which of the driver's variables reach the ranks and the
topology each rank is told (:mod:`.layout`), how the job's end is put down to one rank
in one line (:mod:`.failures`), and how every rank's timeline lands in one directory on
the driver (:mod:`.timeline_gather`). ``hvdprof.ray`` and ``hvdprof.spark`` build on it.
"""
