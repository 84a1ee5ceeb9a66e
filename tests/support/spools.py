"""Spool folders as an operator may configure them (issue 39): symlinks that only the
server's user or root can change, resolved once at start, and symlinks others could
change, or that lead where others may write, refused.

Each layout is made in ``tmp_path`` and returns what ``SPOOL_DIR`` is set to, then
either the real folder it is resolved to (:data:`RESOLVED`) or what the refusal says
(:data:`REFUSED`)."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client import REGISTRY

from chatparity import signals
from chatparity.accounting import spool
from chatparity.metrics.instruments import Metrics

ANOTHER_UID = 4242
"""A user the server is not (files are given to it as root)."""

ANOTHER_USER = pytest.mark.parametrize("other", [-1, 1], ids=["a lower uid", "a higher uid"])
"""This process pretends to be another user: ``os.getuid() + other``."""

AS_ROOT = pytest.mark.skipif(os.getuid() != 0, reason="gives a file to another user: root only")


def private_folder(parent: Path, name: str = "private") -> Path:
    """A folder of this user's alone."""
    folder = parent / name
    folder.mkdir(mode=0o700)
    return folder


def shared_folder(parent: Path, mode: int = 0o777) -> Path:
    """A folder any user may write to (sticky, as /tmp, with ``0o1777``)."""
    folder = parent / "shared"
    folder.mkdir()
    folder.chmod(mode)
    return folder


def a_link_to_a_private_folder(tmp_path: Path) -> tuple[Path, Path]:
    private = private_folder(tmp_path)
    (tmp_path / "spool").symlink_to(private)
    return tmp_path / "spool", private


def a_relative_link(tmp_path: Path) -> tuple[Path, Path]:
    private = private_folder(tmp_path)
    (tmp_path / "spool").symlink_to("private")
    return tmp_path / "spool", private


def a_link_to_a_link(tmp_path: Path) -> tuple[Path, Path]:
    private = private_folder(tmp_path)
    (tmp_path / "hop").symlink_to(private)
    (tmp_path / "spool").symlink_to(tmp_path / "hop")
    return tmp_path / "spool", private


def a_link_in_a_sticky_folder(tmp_path: Path) -> tuple[Path, Path]:
    private = private_folder(tmp_path)
    sticky = shared_folder(tmp_path, 0o1777)  # others may not rename or remove this link
    (sticky / "spool").symlink_to(private)
    return sticky / "spool", private


def a_folder_under_a_linked_volume(tmp_path: Path) -> tuple[Path, Path]:
    volume = private_folder(tmp_path, "volume")
    (tmp_path / "data").symlink_to(volume)
    return tmp_path / "data" / "spool", volume / "spool"  # made there when first needed


RESOLVED = [
    a_link_to_a_private_folder,
    a_relative_link,
    a_link_to_a_link,
    a_link_in_a_sticky_folder,
    a_folder_under_a_linked_volume,
]


def a_link_in_a_shared_folder(tmp_path: Path) -> tuple[Path, str]:
    shared = shared_folder(tmp_path)
    (shared / "spool").symlink_to(private_folder(tmp_path))
    return shared / "spool", f"other users may write to {shared}"


def a_link_into_a_shared_folder(tmp_path: Path) -> tuple[Path, str]:
    shared = shared_folder(tmp_path)
    private_folder(shared, "spool")
    (tmp_path / "spool").symlink_to(shared / "spool")
    return tmp_path / "spool", f"other users may write to {shared}"


def a_link_to_a_shared_folder(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "spool").symlink_to(shared_folder(tmp_path))
    return tmp_path / "spool", "other users may write to it"


def a_link_to_a_folder_others_may_make_first(tmp_path: Path) -> tuple[Path, str]:
    sticky = shared_folder(tmp_path, 0o1777)
    (tmp_path / "spool").symlink_to(sticky / "spool")
    return tmp_path / "spool", "where other users may make it first"


def links_in_a_loop(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "spool").symlink_to(tmp_path / "back")
    (tmp_path / "back").symlink_to(tmp_path / "spool")
    return tmp_path / "spool", "goes through more than 40 symlinks"


def a_link_of_another_user(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "spool").symlink_to(private_folder(tmp_path))
    os.lchown(tmp_path / "spool", ANOTHER_UID, -1)
    return tmp_path / "spool", f"belongs to another user (uid {ANOTHER_UID})"


def a_link_in_a_folder_of_another_user(tmp_path: Path) -> tuple[Path, str]:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "spool").symlink_to(private_folder(tmp_path))
    os.chown(theirs, ANOTHER_UID, -1)
    return theirs / "spool", f"{theirs} belongs to another user (uid {ANOTHER_UID})"


REFUSED = [
    a_link_in_a_shared_folder,
    a_link_into_a_shared_folder,
    a_link_to_a_shared_folder,
    a_link_to_a_folder_others_may_make_first,
    links_in_a_loop,
    pytest.param(a_link_of_another_user, marks=AS_ROOT),
    pytest.param(a_link_in_a_folder_of_another_user, marks=AS_ROOT),
]


def layout_id(layout: object) -> str:
    """A layout's name as a test id."""
    return getattr(layout, "__name__", str(layout)).replace("_", " ")


@contextlib.contextmanager
def failures_counted() -> Iterator[None]:
    """The spool's failures counted as ``chatparity.metrics`` counts them, and said
    afresh (not as said before by other tests)."""
    observer = Metrics()
    signals.observe(observer)
    try:
        with mock.patch.object(spool, "_said", set()):
            yield
    finally:
        signals.unobserve(observer)


def spool_errors(operation: str) -> float:
    """``chatparity_spool_errors_total`` of ``operation`` so far (this process's)."""
    labels = {"operation": operation}
    return REGISTRY.get_sample_value("chatparity_spool_errors_total", labels) or 0.0
