"""The collector's settings for a serving process (chatparity.asgi.tune_gc_for_serving)."""

import gc

import pytest

from chatparity.asgi import YOUNG_COLLECTION_OBJECTS, tune_gc_for_serving


@pytest.fixture
def collector():
    """The collector's settings as they were, back after the test; its passes meanwhile."""
    threshold = gc.get_threshold()
    passes = []

    def note(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(note)
    yield passes
    gc.callbacks.remove(note)
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_what_start_up_loaded_is_out_of_the_collectors_way(collector):
    loaded_at_start_up = [[] for _ in range(100)]
    tune_gc_for_serving()
    assert gc.get_freeze_count() > len(loaded_at_start_up)
    scanned = {id(thing) for thing in gc.get_objects()}
    assert not any(id(thing) in scanned for thing in loaded_at_start_up)
    gc.collect()  # a full collection leaves them frozen
    scanned = {id(thing) for thing in gc.get_objects()}
    assert not any(id(thing) in scanned for thing in loaded_at_start_up)


def test_thousands_of_new_objects_bring_on_no_collection(collector):
    older = gc.get_threshold()[1:]
    tune_gc_for_serving()
    assert gc.get_threshold() == (YOUNG_COLLECTION_OBJECTS, *older)
    collector.clear()
    in_flight = [{"piece": [index]} for index in range(YOUNG_COLLECTION_OBJECTS // 4)]
    assert collector == []  # Python's default (700) would have collected a dozen times over
    assert len(in_flight) == YOUNG_COLLECTION_OBJECTS // 4
