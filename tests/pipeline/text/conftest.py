"""The captions stage run once on the shared small mix output, for the text tests."""

from __future__ import annotations

import pytest

from pipeline.stages import captions


@pytest.fixture(scope="session")
def captioned(mixed, tmp_path_factory):
    """``(params, mix_dir, captions_dir, summary)`` of the captions stage on ``mixed``."""
    params, mix_dir, _, _ = mixed
    out = tmp_path_factory.mktemp("captions") / "captions"
    summary = captions.run(params, mix_dir, out)
    return params, mix_dir, out, summary
