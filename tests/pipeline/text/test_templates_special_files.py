"""A templates file that is a FIFO or a device is refused in one line, before any read blocks."""

from __future__ import annotations

import os

import pytest

from pipeline.text.templates import CaptionError, read_templates


def test_a_fifo_templates_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "templates.txt"
    os.mkfifo(fifo)
    with pytest.raises(CaptionError, match="FIFO"):
        read_templates(fifo)


def test_a_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "templates.txt"
    link.symlink_to("/dev/zero")
    with pytest.raises(CaptionError, match="device"):
        read_templates(link)


def test_a_regular_file_still_reads(tmp_path):
    path = tmp_path / "templates.txt"
    path.write_text("A recording of {}.\nYou can hear {} here.\n", encoding="utf-8")
    assert read_templates(path) == ["A recording of {}.", "You can hear {} here."]
