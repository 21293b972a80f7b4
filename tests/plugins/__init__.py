"""Plug-ins the tests load the way a user's are loaded (``HVDPROF_ANALYSES``,
``HVDPROF_FORMATS``): each is one file, and nothing else in hvdprof names it."""
