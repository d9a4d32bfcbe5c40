"""The shards of an interrupted extraction (issue 29): a damaged shard (truncated) and two swapped
shard files are noticed, named with their folder in a warning, extracted again, and the store ends
with the same bits as an uninterrupted extraction; a shard damaged after that check stops the write
in one line naming shard and folder."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
from _extract_helpers import SlowMean, make_images

from pipeline.extract.shards import read_shard, shard_id
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import InputError

OPTS = dict(batch_images=2, shard_images=4, chunk_rows=6, labels="folders")


class FailingMean(SlowMean):
    """SlowMean (same name and parameters, so the same work folder) that fails after 6 batches."""

    def __call__(self, images):
        if self.calls >= 6:
            raise RuntimeError("stopped on purpose")
        return super().__call__(images)


@pytest.fixture
def interrupted(tmp_path):
    """An image folder, the work folder of an extraction stopped after 3 shards, and a reference store."""
    src = tmp_path / "imgs"
    make_images(src, 24, seed=6, classes=2)
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        ingest(str(src), tmp_path / "s", extractor=FailingMean(), **OPTS)
    (work,) = tmp_path.glob("s.extract-*")
    assert sorted(p.name for p in work.glob("shard-*.npz")) == [f"shard-00000{i}.npz" for i in range(3)]
    ingest(str(src), tmp_path / "ref", extractor=SlowMean(), **OPTS)
    return src, work


def _same_store(a, b):
    a, b = FeatureStore.open(a), FeatureStore.open(b)
    np.testing.assert_array_equal(a.read(), b.read())
    assert list(a.read_ids()) == list(b.read_ids()) and a.fingerprint == b.fingerprint


def test_a_damaged_shard_is_named_and_extracted_again(interrupted, tmp_path, caplog):
    src, work = interrupted
    shard = work / "shard-000001.npz"
    shard.write_bytes(shard.read_bytes()[:200])  # truncated
    with caplog.at_level(logging.WARNING, logger="vbcluster.extract"):
        rep = ingest(str(src), tmp_path / "s", extractor=SlowMean(), **OPTS)
    assert rep.shards_resumed == 2
    assert f"extracting shard shard-000001.npz of {work} again: unreadable (BadZipFile" in caplog.text
    _same_store(tmp_path / "s", tmp_path / "ref")


def test_swapped_shards_are_noticed(interrupted, tmp_path, caplog):
    src, work = interrupted
    a, b = work / "shard-000000.npz", work / "shard-000001.npz"
    shutil.move(a, work / "x")
    shutil.move(b, a)
    shutil.move(work / "x", b)
    with caplog.at_level(logging.WARNING, logger="vbcluster.extract"):
        rep = ingest(str(src), tmp_path / "s", extractor=SlowMean(), **OPTS)
    assert rep.shards_resumed == 1  # shard 2 only
    assert caplog.text.count("holds another shard's images (shard files swapped or copied)") == 2
    _same_store(tmp_path / "s", tmp_path / "ref")


def test_a_shard_damaged_while_being_read_is_one_line(interrupted):
    _, work = interrupted
    shard = work / "shard-000002.npz"
    sid = shard_id(2, ["any"])
    with pytest.raises(InputError, match=rf"extraction shard shard-000002.npz in {work}: it holds another "
                                         r"shard's images"):
        read_shard(work, 2, sid)
    shard.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(InputError, match=rf"extraction shard shard-000002.npz in {work}: unreadable "
                                         r"\(BadZipFile"):
        read_shard(work, 2, sid)
