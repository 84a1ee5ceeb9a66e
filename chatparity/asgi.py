"""The documented import path of the ASGI fast path (``chatparity.asgi.FastPath``), and
the garbage collector's settings for a process that serves it."""

import gc

from .transport.fastpath import FastPath

__all__ = ["FastPath", "tune_gc_for_serving"]

YOUNG_COLLECTION_OBJECTS = 20_000
"""New objects the collector lets accumulate before it collects the youngest generation
(Python's default: 700)."""


def tune_gc_for_serving() -> None:
    """Set the garbage collector up for a worker that serves requests: call it last in the
    site's ASGI module, once start-up has loaded Django, the apps and (through
    :class:`FastPath`) the URLconf.

    What start-up loaded (over 100,000 objects) is frozen, so full collections no longer
    scan it: under load each took 60-80 ms. And the youngest generation is collected
    after :data:`YOUNG_COLLECTION_OBJECTS` new objects instead of 700: with 700 a
    collection ran every few requests and moved the objects of every request in flight
    into the older generations, where they died and brought on the older collections
    (5-20 ms each). A request's objects are freed by their reference counts as it ends;
    the collector is left the cycles, which requests make few of.
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_OBJECTS, *gc.get_threshold()[1:])
