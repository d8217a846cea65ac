"""Pooling statistics carried inside the .pte, next to the delegate they describe.

A TOSA flatbuffer alone cannot say what pooling saved (the "before" graph is
gone), so the backend stores `PoolingStats` as ExecuTorch named data
(`PreprocessResult.data_store_output`), which `to_executorch` writes into the
.pte. The key is derived from the delegate payload itself, so a reader finds
the record of a delegate without knowing partition tags, and several
delegates never collide.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput

from codec_tosa.serialization.pooled import PoolingStats

PREFIX = "codec_tosa.pooling_stats."


def record_key(payload: bytes) -> str:
    """Named-data key of the pooling record of the delegate with this payload."""
    return PREFIX + hashlib.sha256(payload).hexdigest()[:32]


def pooling_record(stats: PoolingStats, payload: bytes) -> NamedDataStoreOutput:
    """Named data to return from `preprocess` as `data_store_output`.

    The time spent pooling is left out: an artefact must not depend on how busy
    the machine was (the same model compiles to the same bytes).
    """
    store = NamedDataStore()
    record = replace(stats, seconds=0.0)
    store.add_named_data(record_key(payload), record.to_json(indent=None).encode())
    return store.get_named_data_store_output()
