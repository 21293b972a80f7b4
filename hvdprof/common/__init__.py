"""What every layer shares and nothing else: the records the cycle hands its observers
(:mod:`.records`), the clock every rank stamps events with (:mod:`.timebase`) and the
names of the phases, lanes and instants on a timeline (:mod:`.activities`).

The runtime produces these, the timeline and the autotuner consume them, and the analysis
reads the names back from trace files. Keeping them here, below all of those, is what lets
data flow one way: ``common`` imports nothing from hvdprof but the configuration.
"""
